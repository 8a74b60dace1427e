// Command goreqapp is the Go application of tests/apps TestRequestTreesGo,
// the counterpart of tests/apps/testdata/reqapp.py: an HTTP/1.1 server
// (net/http, a goroutine per connection) that answers each request with N
// sequential PostgreSQL queries (database/sql, lib/pq) and then M redis
// calls (go-redis v9, SET and GET in turn), all made by the handler's own
// goroutine. Both pools keep -conns connections, opened before it listens.
//
//	goreqapp -listen 127.0.0.1:8000 -pg 'host=10.0.0.2 port=5432 user=postgres dbname=postgres sslmode=disable' \
//	    -redis 10.0.0.2:6379 -n 5 -m 3 -log requests.log
//
// For each request it logs one line, its own truth for the test:
//
//	req PATH GOID TID T0 T1 PG REDIS PEER_PORT CALLS
//
// GOID is the handler's goroutine, TID the thread it ran on as it began
// (the request read just before), T0 when the handler began (the request
// read) and T1 just before the answer is written, both CLOCK_MONOTONIC in
// nanoseconds (the clock of lattrace's records); PG and REDIS the calls
// made; PEER_PORT the port of the connection the request came on (nginx's
// end). CALLS lists each call's write to its database, comma-separated, as
// SVC:LOCAL_PORT:TID:W0:W1 (SVC pg or redis, LOCAL_PORT this end of the
// connection it went on, TID the thread of the write, W0 and W1
// CLOCK_MONOTONIC before and after the write system call): the call's
// exchange is the one on that connection whose first write lies in
// W0..W1. A write to a database by no request's goroutine once the server
// listens is logged as
//
//	orphan SVC LOCAL_PORT GOID TID W0 W1
package main

import (
	"bytes"
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"golang.org/x/sys/unix"
)

var (
	listen    = flag.String("listen", "127.0.0.1:8000", "address to serve HTTP on")
	pgDSN     = flag.String("pg", "", "PostgreSQL connection string (lib/pq)")
	redisAddr = flag.String("redis", "", "redis address, host:port")
	nQueries  = flag.Int("n", 5, "PostgreSQL queries per request")
	mRedis    = flag.Int("m", 3, "redis calls per request")
	query     = flag.String("query", "SELECT 1", "the query")
	conns     = flag.Int("conns", 8, "connections of each pool, opened before listening")
	logPath   = flag.String("log", "", "the requests' log")
)

var (
	db  *sql.DB
	rdb *redis.Client

	logMu   sync.Mutex
	logFile *os.File

	// active maps a handler's goroutine to its request's calls while it
	// runs; serving is set once the server listens.
	active  sync.Map // uint64 -> *reqState
	serving atomic.Bool
)

func mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// goid is the calling goroutine's id, from the first line of its stack
// ("goroutine 18 [running]:").
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
}

type call struct {
	svc       string
	port, tid int
	w0, w1    int64
}

type reqState struct {
	mu    sync.Mutex
	calls []call
}

// tracked is a database connection whose writes are logged against the
// request of the goroutine that makes them.
type tracked struct {
	net.Conn
	svc  string
	port int
}

func (c *tracked) Write(b []byte) (int, error) {
	g := goid()
	tid := unix.Gettid()
	w0 := mono()
	n, err := c.Conn.Write(b)
	w1 := mono()
	if st, ok := active.Load(g); ok {
		st := st.(*reqState)
		st.mu.Lock()
		st.calls = append(st.calls, call{svc: c.svc, port: c.port, tid: tid, w0: w0, w1: w1})
		st.mu.Unlock()
	} else if serving.Load() {
		writeLog(fmt.Sprintf("orphan %s %d %d %d %d %d\n", c.svc, c.port, g, tid, w0, w1))
	}
	return n, err
}

func dialTracked(ctx context.Context, svc, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	port := 0
	if a, ok := c.LocalAddr().(*net.TCPAddr); ok {
		port = a.Port
	}
	return &tracked{Conn: c, svc: svc, port: port}, nil
}

// pgDialer gives lib/pq tracked connections.
type pgDialer struct{}

func (pgDialer) Dial(network, addr string) (net.Conn, error) {
	return dialTracked(context.Background(), "pg", network, addr)
}

func (pgDialer) DialTimeout(network, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return dialTracked(ctx, "pg", network, addr)
}

func (pgDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialTracked(ctx, "pg", network, addr)
}

func writeLog(line string) {
	logMu.Lock()
	defer logMu.Unlock()
	if _, err := logFile.WriteString(line); err != nil {
		log.Fatal(err)
	}
}

func handle(w http.ResponseWriter, r *http.Request) {
	t0 := mono()
	g, tid := goid(), unix.Gettid()
	st := &reqState{}
	active.Store(g, st)
	ctx := r.Context()
	fail := func(err error) {
		active.Delete(g)
		log.Printf("%s: %v", r.URL.Path, err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
	npg, nredis := 0, 0
	for range *nQueries {
		var v int
		if err := db.QueryRowContext(ctx, *query).Scan(&v); err != nil {
			fail(err)
			return
		}
		npg++
	}
	key := fmt.Sprintf("k%d", g)
	for i := range *mRedis {
		var err error
		if i%2 == 0 {
			err = rdb.Set(ctx, key, "v", 0).Err()
		} else {
			err = rdb.Get(ctx, key).Err()
		}
		if err != nil {
			fail(err)
			return
		}
		nredis++
	}
	active.Delete(g)
	t1 := mono()
	peer := 0
	if ap, err := netAddrPort(r.RemoteAddr); err == nil {
		peer = ap
	}
	calls := make([]string, 0, len(st.calls))
	for _, c := range st.calls {
		calls = append(calls, fmt.Sprintf("%s:%d:%d:%d:%d", c.svc, c.port, c.tid, c.w0, c.w1))
	}
	if len(calls) == 0 {
		calls = append(calls, "-")
	}
	writeLog(fmt.Sprintf("req %s %d %d %d %d %d %d %d %s\n", r.URL.Path, g, tid, t0, t1, npg, nredis, peer, strings.Join(calls, ",")))
	body := []byte("ok\n")
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Write(body)
}

func netAddrPort(s string) (int, error) {
	_, p, err := net.SplitHostPort(s)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

// warm opens every connection of both pools, each used once, so that no
// request connects or makes a client's set-up round trips.
func warm(ctx context.Context) error {
	pcs := make([]*sql.Conn, *conns)
	for i := range pcs {
		c, err := db.Conn(ctx)
		if err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		if err := c.PingContext(ctx); err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		pcs[i] = c
	}
	for _, c := range pcs {
		c.Close()
	}
	rcs := make([]*redis.Conn, *conns)
	for i := range rcs {
		rcs[i] = rdb.Conn()
		if err := rcs[i].Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis: %w", err)
		}
	}
	for _, c := range rcs {
		c.Close()
	}
	if st := db.Stats(); st.OpenConnections != *conns || st.Idle != *conns {
		return fmt.Errorf("postgres: %d connections open, %d idle after warming %d", st.OpenConnections, st.Idle, *conns)
	}
	if st := rdb.PoolStats(); int(st.TotalConns) != *conns || int(st.IdleConns) != *conns {
		return fmt.Errorf("redis: %d connections open, %d idle after warming %d", st.TotalConns, st.IdleConns, *conns)
	}
	return nil
}

func main() {
	flag.Parse()
	log.SetFlags(log.Lmicroseconds)
	if *pgDSN == "" || *redisAddr == "" || *logPath == "" {
		log.Fatal("-pg, -redis and -log are required")
	}
	var err error
	if logFile, err = os.OpenFile(*logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err != nil {
		log.Fatal(err)
	}
	connector, err := pq.NewConnector(*pgDSN)
	if err != nil {
		log.Fatal(err)
	}
	connector.Dialer(pgDialer{})
	db = sql.OpenDB(connector)
	db.SetMaxOpenConns(2 * *conns)
	db.SetMaxIdleConns(2 * *conns)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	rdb = redis.NewClient(&redis.Options{
		Addr:     *redisAddr,
		PoolSize: 2 * *conns,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialTracked(ctx, "redis", network, addr)
		},
		// No maintenance notifications: nothing but the calls on the
		// connections once they are set up.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := warm(ctx); err != nil {
		log.Fatal(err)
	}
	cancel()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	serving.Store(true)
	log.Printf("listening on %s (%d connections to each database)", ln.Addr(), *conns)
	srv := &http.Server{Handler: http.HandlerFunc(handle), ErrorLog: log.Default()}
	log.Fatal(srv.Serve(ln))
}
