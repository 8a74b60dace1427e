package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"
	"unicode"
)

// Errors a client tells apart, to say what to do about them.
var (
	// ErrNoDaemon: nothing listens at the address.
	ErrNoDaemon = errors.New("no lattrace daemon")
	// ErrPermission: the socket exists but this user may not connect.
	ErrPermission = errors.New("permission denied")
	// ErrNotFound: the flow or pair asked for is not (or no longer) there.
	ErrNotFound = errors.New("not found")
)

// Client calls a daemon's API.
type Client struct {
	// Target is the address as given: a socket path or host:port.
	Target string
	base   string
	hc     *http.Client
}

// NewClient returns a client for target: "unix:/path" or an absolute
// socket path for the Unix socket, "host:port" or "http://host:port" for
// TCP.
func NewClient(target string) (*Client, error) {
	c := &Client{Target: target}
	tr := &http.Transport{MaxIdleConns: 2, IdleConnTimeout: 30 * time.Second}
	switch {
	case strings.HasPrefix(target, "unix:") || strings.HasPrefix(target, "/"):
		path := strings.TrimPrefix(strings.TrimPrefix(target, "unix:"), "//")
		if path == "" {
			return nil, fmt.Errorf("API address %q has no socket path", target)
		}
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
		c.base = "http://lattrace"
	default:
		u := target
		if !strings.Contains(u, "://") {
			u = "http://" + u
		}
		pu, err := url.Parse(u)
		if err != nil || pu.Host == "" || pu.Scheme != "http" {
			return nil, fmt.Errorf("API address %q is neither a socket path nor host:port", target)
		}
		// The daemon serves TCP on loopback only; anything else is a typo
		// or another service, and a name would cost a DNS lookup.
		if ip := net.ParseIP(pu.Hostname()); pu.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, fmt.Errorf("API address %q: the daemon's API is a socket path or a loopback host:port (127.0.0.1, [::1], localhost)", target)
		}
		c.base = "http://" + pu.Host
	}
	c.hc = &http.Client{
		Transport: tr, Timeout: 10 * time.Second,
		// The API never redirects: an answer that does is not the
		// daemon's, and following it could take the request off
		// loopback.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return c, nil
}

// get fetches path (with query v) into out.
func (c *Client) get(ctx context.Context, path string, v url.Values, out any) error {
	u := c.base + "/" + Version + path
	if len(v) > 0 {
		u += "?" + v.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		switch {
		case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ECONNREFUSED):
			return fmt.Errorf("%w at %s", ErrNoDaemon, c.Target)
		case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
			return fmt.Errorf("%w: the API socket %s is root-only (mode 0600); run as root (sudo)", ErrPermission, c.Target)
		}
		return fmt.Errorf("API at %s: %w", c.Target, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("API at %s: %w", c.Target, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e Error
		if json.Unmarshal(body, &e) != nil || e.Error == "" {
			// Not a lattrace answer: something else listens there.
			return fmt.Errorf("%s answered %s, not as a lattrace API %s: is the address right?", c.Target, printable(resp.Status), Version)
		}
		msg := printable(e.Error)
		if resp.StatusCode == http.StatusNotFound {
			return fmt.Errorf("%w: %s", ErrNotFound, msg)
		}
		return fmt.Errorf("API answered %d: %s", resp.StatusCode, msg)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("API at %s answered something that is not API %s JSON: %s", c.Target, Version, printable(err.Error()))
	}
	return nil
}

// printable is text from the other end of the socket made fit for one line
// on a terminal: its control characters (line breaks, escape sequences)
// become spaces.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// Health asks whether the daemon traces and loses nothing.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	return h, c.get(ctx, "/health", nil, &h)
}

// Flows lists the flows q selects.
func (c *Client) Flows(ctx context.Context, q Query) (FlowList, error) {
	var l FlowList
	return l, c.get(ctx, "/flows", q.Values(), &l)
}

// Peers lists the peer pairs q selects.
func (c *Client) Peers(ctx context.Context, q Query) (PeerList, error) {
	var l PeerList
	return l, c.get(ctx, "/peers", q.Values(), &l)
}

// Flow returns one flow and its recent exchanges.
func (c *Client) Flow(ctx context.Context, id string) (FlowDetail, error) {
	var d FlowDetail
	return d, c.get(ctx, "/flows/"+url.PathEscape(id), nil, &d)
}

// Peer returns one peer pair and its flows.
func (c *Client) Peer(ctx context.Context, id string) (PeerDetail, error) {
	var d PeerDetail
	return d, c.get(ctx, "/peers/"+url.PathEscape(id), nil, &d)
}
