package api

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/history"
	"github.com/lattrace/lattrace/daemon/requests"
)

// Without request trees the endpoints say how to get them; with them, the
// list answers, a bad parameter is a 400 and an unknown request a 404.
func TestRequestsEndpoints(t *testing.T) {
	s := NewServer(aggregate.New(aggregate.Config{}), history.New(history.Config{}), func() Health { return Health{} }, nil, nil)
	code, body := get(t, s.Handler(), "GET", "/v1/requests")
	if code != 404 || !strings.Contains(string(body), "--request-trees") {
		t.Errorf("without trees: %d %s", code, body)
	}
	s.SetRequests(requests.New(requests.Config{}))
	code, body = get(t, s.Handler(), "GET", "/v1/requests?trees=1")
	var l RequestList
	if err := json.Unmarshal(body, &l); code != 200 || err != nil || l.APIVersion != Version {
		t.Errorf("list: %d %v %s", code, err, body)
	}
	if code, body := get(t, s.Handler(), "GET", "/v1/requests?trees=yes"); code != 400 {
		t.Errorf("trees=yes: %d %s", code, body)
	}
	if code, body := get(t, s.Handler(), "GET", "/v1/requests/1-2"); code != 404 || !strings.Contains(string(body), "no recent request") {
		t.Errorf("unknown request: %d %s", code, body)
	}
}
