package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/lattrace/lattrace/daemon/requests"
	"github.com/lattrace/lattrace/record"
)

// RequestList is the answer of GET /v1/requests: per root endpoint, per
// service edge and per process what the request trees showed, and, with
// ?trees=1, the most recent trees.
type RequestList struct {
	APIVersion string `json:"api_version"`
	requests.Snapshot
}

// RequestDetail is the answer of GET /v1/requests/{id}: one recent tree.
type RequestDetail struct {
	APIVersion string          `json:"api_version"`
	Request    *record.Request `json:"request"`
}

// SetRequests serves t's request trees; without it the endpoints answer
// that the daemon makes none.
func (s *Server) SetRequests(t *requests.Tracker) { s.requests = t }

func (s *Server) getRequests(w http.ResponseWriter, r *http.Request) {
	if s.requests == nil {
		writeError(w, http.StatusNotFound, "this daemon makes no request trees: it runs with --request-trees=false")
		return
	}
	trees := r.URL.Query().Get("trees")
	if trees != "" && trees != "0" && trees != "1" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("trees=%q: want 0 or 1", trees))
		return
	}
	writeJSON(w, RequestList{APIVersion: Version, Snapshot: s.requests.Snapshot(trees == "1")})
}

func (s *Server) getRequest(w http.ResponseWriter, r *http.Request) {
	if s.requests == nil {
		writeError(w, http.StatusNotFound, "this daemon makes no request trees: it runs with --request-trees=false")
		return
	}
	req, err := s.requests.Request(r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	writeJSON(w, RequestDetail{APIVersion: Version, Request: req})
}

// Requests lists what the request trees showed; trees adds the recent ones.
func (c *Client) Requests(ctx context.Context, trees bool) (RequestList, error) {
	var l RequestList
	v := url.Values{}
	if trees {
		v.Set("trees", "1")
	}
	return l, c.get(ctx, "/requests", v, &l)
}

// Request returns one recent request tree.
func (c *Client) Request(ctx context.Context, id string) (RequestDetail, error) {
	var d RequestDetail
	return d, c.get(ctx, "/requests/"+url.PathEscape(id), nil, &d)
}
