package jsonl

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/lattrace/lattrace/record"
)

func TestLinesAndTypes(t *testing.T) {
	var b bytes.Buffer
	w := New(&b)
	w.Exchange(&record.Exchange{Role: record.Requester, BytesOut: 7})
	w.ConnOpen(record.ConnOpen{Role: record.RoleClient})
	w.ConnClose(record.ConnClose{SendCalls: 3})
	w.Flush()
	dec := json.NewDecoder(&b)
	for _, want := range []string{TypeExchange, TypeConnOpen, TypeConnClose} {
		var v struct{ Type string }
		if err := dec.Decode(&v); err != nil || v.Type != want {
			t.Fatalf("line type %q (%v), want %q", v.Type, err, want)
		}
	}
}

type failing struct{}

func (failing) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// A write error is reported once and every record after it is counted.
func TestErrorsAreCounted(t *testing.T) {
	w := New(failing{})
	var reported []error
	w.OnError = func(err error) { reported = append(reported, err) }
	w.ConnClose(record.ConnClose{})
	w.Flush() // the buffered line fails here
	w.ConnClose(record.ConnClose{})
	w.ConnClose(record.ConnClose{})
	w.Flush()
	if len(reported) != 1 || w.Err() == nil {
		t.Fatalf("reported %v, err %v", reported, w.Err())
	}
	if w.Dropped() != 3 {
		t.Errorf("dropped %d, want 3 (the failed flush and two later records)", w.Dropped())
	}
}
