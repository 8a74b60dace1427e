package apps

import (
	"context"
	"database/sql"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/record"
)

// MariaDB speaks first: its greeting comes before the client's first
// byte. A client that times its own queries (SELECT SLEEP, 13 ms on the
// server) runs them on one connection and with a connection per query;
// the client is the requester on both ends, the greeting and the login are
// connection set-up, each query is one exchange, and a connection per
// query is named.
func TestMariaDB(t *testing.T) {
	for _, cc := range congestionControls {
		for _, perQuery := range []bool{false, true} {
			name := cc + " one connection"
			if perQuery {
				name = cc + " a connection per query"
			}
			t.Run(name, func(t *testing.T) {
				a := newApp(t, cc)
				const port = 3306
				a.mariadb(port)
				const n = 30
				wire := a.capture(port)
				setups, queries := a.mysqlClient(port, n, perQuery)
				think := median(slowLogTimes(t, filepath.Join(a.dir, "slow.log")))
				client, server := a.ends(port)
				tr := truth{requests: n, samples: n, extra: 1, p50: quantile(queries, 0.5), p99: quantile(queries, 0.99),
					think: &think, setup: true, departures: departures(t, wire, port)}
				if perQuery {
					tr.extra = n
					tr.expected = []record.DiagnosisName{diagnose.ConnPerRequest}
				}
				a.check("MariaDB, SELECT SLEEP(0.013), "+name, client, server, tr)

				// The first exchange of each connection is its set-up:
				// connect, the server's greeting, the login.
				var firsts []time.Duration
				agg := aggregate.New(aggregate.Config{})
				for _, e := range client {
					agg.AddExchange(e)
					if e.First {
						firsts = append(firsts, e.Duration)
						if !e.Greeting {
							t.Errorf("the first exchange of a MariaDB connection does not say the server greeted")
						}
					}
				}
				if got, want := median(firsts), median(setups); !within(got, want, 0.05, time.Millisecond) {
					t.Errorf("connection set-up %v (median), the client's own %v", got, want)
				}
				if perQuery {
					fired := false
					for _, p := range agg.Peers() {
						fired = fired || find(diagnose.OfPair(&p), diagnose.ConnPerRequest)
					}
					if !fired {
						t.Errorf("connection_per_request did not fire on a connection per query")
					}
				}
			})
		}
	}
}

func find(ds []record.Diagnosis, n record.DiagnosisName) bool {
	for _, d := range ds {
		if d.Name == n {
			return true
		}
	}
	return false
}

// mariadb starts MariaDB in B, without grant tables (any user, no
// password), logging every statement's time to slow.log.
func (a *app) mariadb(port uint16) {
	a.t.Helper()
	data := filepath.Join(a.dir, "mysql")
	if err := os.Mkdir(data, 0o700); err != nil {
		a.t.Fatal(err)
	}
	a.chownTo("mysql", data)
	if out, err := exec.Command("mariadb-install-db", "--user=mysql", "--datadir="+data, "--skip-test-db",
		"--auth-root-authentication-method=normal").CombinedOutput(); err != nil {
		a.t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	slow := filepath.Join(a.dir, "slow.log")
	a.chownTo("mysql", a.file("slow.log", ""))
	a.serve(port, "mariadbd", "--no-defaults", "--user=mysql", "--datadir="+data, "--bind-address="+a.server().String(),
		"--port="+strconv.Itoa(int(port)), "--socket="+filepath.Join(data, "sock"), "--pid-file="+filepath.Join(data, "pid"),
		"--skip-grant-tables", "--skip-name-resolve", "--slow-query-log", "--slow-query-log-file="+slow, "--long-query-time=0")
}

// mysqlDB is a pool of connections from A to MariaDB in B, as root.
func (a *app) mysqlDB(port uint16) *sql.DB {
	a.t.Helper()
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr = "root", "tcp", net.JoinHostPort(a.server().String(), strconv.Itoa(int(port)))
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return a.lab.A.Dial(ctx, nil, network, addr)
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		a.t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	return db
}

// mysqlClient runs n queries from A, timing each itself, and the set-up
// (connect, greeting, login) of each connection it opens.
func (a *app) mysqlClient(port uint16, n int, perQuery bool) (setups, queries []time.Duration) {
	a.t.Helper()
	db := a.mysqlDB(port)
	defer db.Close()
	db.SetMaxOpenConns(1)
	if perQuery {
		db.SetMaxIdleConns(0)
	}
	ctx := context.Background()
	var conn *sql.Conn
	for i := range n {
		if conn == nil {
			start := time.Now()
			// db.Conn connects and logs in, and asks nothing more.
			var err error
			if conn, err = db.Conn(ctx); err != nil {
				a.t.Fatal(err)
			}
			setups = append(setups, time.Since(start))
		}
		var v int
		start := time.Now()
		if err := conn.QueryRowContext(ctx, "SELECT SLEEP(0.013)").Scan(&v); err != nil {
			a.t.Fatalf("query %d: %v", i, err)
		}
		queries = append(queries, time.Since(start))
		if perQuery || i == n-1 {
			conn.Close()
			conn = nil
		}
	}
	db.Close()
	a.quiesce()
	return setups, queries
}

var slowQueryTime = regexp.MustCompile(`(?m)^# Query_time: ([0-9.]+)\s.*\n(?:#.*\n|SET timestamp.*\n)*SELECT SLEEP`)

// slowLogTimes reads the server's own time of each SELECT SLEEP from its
// slow query log (long_query_time=0 logs every statement).
func slowLogTimes(t *testing.T, path string) []time.Duration {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Duration
	for _, m := range slowQueryTime.FindAllStringSubmatch(string(b), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		out = append(out, time.Duration(v*float64(time.Second)))
	}
	if len(out) == 0 {
		t.Fatalf("no SELECT SLEEP in the server's slow log:\n%s", b)
	}
	return out
}
