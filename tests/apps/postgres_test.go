package apps

import (
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// PostgreSQL and pgbench on one connection, each transaction a query that
// sleeps 13 ms on the server (pg_sleep): the server's own log times each
// statement, which is the think time lattrace must find at both ends.
func TestPostgres(t *testing.T) {
	for _, cc := range congestionControls {
		t.Run(cc, func(t *testing.T) {
			a := newApp(t, cc)
			const port = 5432
			a.postgres(port)
			script := a.file("sleep.sql", "SELECT pg_sleep(0.013);\n")
			const n = 40
			wire := a.capture(port)
			a.client("pgbench", "-h", a.server().String(), "-p", strconv.Itoa(port), "-U", "postgres", "-n",
				"-c", "1", "-t", strconv.Itoa(n), "-f", script, "-l", "--log-prefix", filepath.Join(a.dir, "pgbench"), "postgres")
			lats := pgbenchLatencies(t, a.dir)
			think := median(statementDurations(t, a.log("runuser")))
			client, server := a.ends(port)
			// Around the transactions, on each of pgbench's two
			// connections (it checks the server on one first): the
			// SSLRequest and the start-up message, answered, and the
			// closing Terminate, unanswered.
			a.check("pgbench, pg_sleep 13 ms ("+cc+")", client, server, truth{requests: len(lats), samples: n, extra: 4,
				p50: quantile(lats, 0.5), p99: quantile(lats, 0.99), think: &think, departures: departures(t, wire, port)})
		})
	}
}

// postgres starts PostgreSQL in B, trusting A, logging each statement's time.
func (a *app) postgres(port uint16) {
	t := a.t
	t.Helper()
	bin := postgresBin(t)
	data := filepath.Join(a.dir, "pg")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	a.chownTo("postgres", data)
	if out, err := exec.Command("runuser", "-u", "postgres", "--", filepath.Join(bin, "initdb"), "-D", data,
		"--auth=trust", "-U", "postgres", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	hba, err := os.OpenFile(filepath.Join(data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	hba.WriteString("host all all " + a.lab.A.IPv4.String() + "/32 trust\n")
	hba.Close()
	a.serve(port, "runuser", "-u", "postgres", "--", filepath.Join(bin, "postgres"), "-D", data,
		"-c", "listen_addresses="+a.server().String(), "-p", strconv.Itoa(int(port)),
		"-c", "unix_socket_directories="+data, "-c", "fsync=off", "-c", "log_min_duration_statement=0")
}

// postgresBin is the directory of Debian's PostgreSQL server programs.
func postgresBin(t *testing.T) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d
		}
	}
	t.Fatal("no PostgreSQL server in /usr/lib/postgresql (make setup installs it)")
	return ""
}

// chownTo gives path to a system user, whose server may then traverse the
// test's directories (made root-only by testing.T.TempDir).
func (a *app) chownTo(name, path string) {
	a.t.Helper()
	u, err := user.Lookup(name)
	if err != nil {
		a.t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(path, uid, gid); err != nil {
		a.t.Fatal(err)
	}
	for d := filepath.Dir(path); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			a.t.Fatal(err)
		}
	}
}

// pgbenchLatencies reads pgbench's per-transaction log (-l): each line is
// "client transaction latency_us script epoch epoch_us".
func pgbenchLatencies(t *testing.T, dir string) []time.Duration {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "pgbench.*"))
	var out []time.Duration
	for _, f := range files {
		out = append(out, microsColumn(t, f, 2)...)
	}
	if len(out) == 0 {
		t.Fatalf("no transactions in pgbench's log (%v)", files)
	}
	return out
}

// microsColumn reads a client's per-request log of whitespace-separated
// columns: column col (from 0) of each line, in microseconds.
func microsColumn(t *testing.T, path string, col int) []time.Duration {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Duration
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) <= col {
			continue
		}
		us, err := strconv.Atoi(f[col])
		if err != nil {
			t.Fatalf("%s: line %q: %v", path, line, err)
		}
		out = append(out, time.Duration(us)*time.Microsecond)
	}
	return out
}

var pgDuration = regexp.MustCompile(`duration: ([0-9.]+) ms\s+statement: SELECT pg_sleep`)

// statementDurations reads the server's own time per statement from its
// log (log_min_duration_statement=0).
func statementDurations(t *testing.T, log string) []time.Duration {
	t.Helper()
	var out []time.Duration
	for _, m := range pgDuration.FindAllStringSubmatch(log, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		out = append(out, time.Duration(v*float64(time.Millisecond)))
	}
	if len(out) == 0 {
		t.Fatalf("no statement durations in the server's log:\n%s", tail(log))
	}
	return out
}

func median(ds []time.Duration) time.Duration { return quantile(ds, 0.5) }
