package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/daemon/requests"
	"github.com/lattrace/lattrace/record"
)

func newExplain() *cobra.Command {
	var whatIfArg, request string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "explain FLOW|PEER | explain --request ID",
		Short: "say in words where a flow's, a peer pair's or a request's time goes, what is abnormal and what to fix",
		Long: "FLOW is a flow id (a number, the ID column of `lattrace flows`); PEER a peer pair id\n" +
			"(p followed by hex digits, from `lattrace flows --peers`); --request ID a request across\n" +
			"services (from `lattrace requests --trees`), its tree hop by hop.",
		Args: cobra.MaximumNArgs(1),
	}
	target, _ := apiFlag(cmd)
	cmd.Flags().StringVar(&whatIfArg, "what-if", "", "also estimate the latency if the peer were this much more round-trip time away (e.g. 20ms);\nwith --request, if one service moved: SERVICE=+20ms (a pod or command, as the tree names it)")
	cmd.Flags().StringVar(&request, "request", "", "explain this request (an id from `lattrace requests --trees`)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the API's JSON for it instead")
	var c *api.Client
	var whatIf time.Duration
	var move *requests.Move
	cmd.PreRunE = func(_ *cobra.Command, args []string) error {
		var err error
		if c, err = api.NewClient(target()); err != nil {
			return usageError{err}
		}
		if request != "" {
			if len(args) != 0 {
				return usageError{fmt.Errorf("--request %s and %s: explain one thing at a time", request, args[0])}
			}
			if whatIfArg != "" {
				m, err := requests.ParseMove(whatIfArg)
				if err != nil {
					return usageError{fmt.Errorf("--what-if: %w", err)}
				}
				move = &m
			}
			return nil
		}
		if len(args) != 1 {
			return usageError{errors.New("explain what: a flow id, a peer pair id, or --request ID")}
		}
		if whatIfArg != "" {
			if whatIf, err = time.ParseDuration(whatIfArg); err != nil {
				return usageError{fmt.Errorf("--what-if %q: want a duration such as 20ms (SERVICE=+20ms goes with --request)", whatIfArg)}
			}
			if whatIf < 0 {
				return usageError{fmt.Errorf("--what-if %v is negative", whatIf)}
			}
		}
		if id := args[0]; !flowID.MatchString(id) && !peerID.MatchString(id) {
			return usageError{fmt.Errorf("%q is neither a flow id (a number) nor a peer pair id (p and 12 hex digits): see `lattrace flows` and `lattrace flows --peers`", id)}
		}
		return nil
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		out := cmd.OutOrStdout()
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if request != "" {
			d, err := c.Request(cmd.Context(), request)
			if err != nil {
				return lookupError(err, "request", request, target())
			}
			var p *requests.Prediction
			if move != nil {
				w := requests.WhatIf(d.Request, *move)
				p = &w
			}
			if asJSON {
				return enc.Encode(struct {
					api.RequestDetail
					WhatIf *requests.Prediction `json:"what_if,omitempty"`
				}{d, p})
			}
			WriteTree(out, d.Request)
			if p != nil {
				fmt.Fprintf(out, "\nWhat if %s moved %v farther (each round trip to it %v longer): %.1f round trips on the critical path cross its edges, so the request would take %s (+%s).\n",
					move.Service, move.Extra, move.Extra, p.RoundTrips, ms(p.Duration), ms(p.Added))
				if p.RoundTrips == 0 {
					fmt.Fprintf(out, "No hop on the critical path has %s at one end: check the names in the tree above.\n", move.Service)
				}
			}
			return nil
		}
		id := args[0]
		var ex explanation
		var detail any
		if strings.HasPrefix(id, "p") {
			d, err := c.Peer(cmd.Context(), id)
			if err != nil {
				return lookupError(err, "peer pair", id, target())
			}
			detail, ex = d, peerExplanation(&d)
		} else {
			d, err := c.Flow(cmd.Context(), id)
			if err != nil {
				return lookupError(err, "flow", id, target())
			}
			detail, ex = d, flowExplanation(&d)
		}
		if asJSON {
			return enc.Encode(detail)
		}
		ex.whatIf = whatIf
		ex.write(out)
		return nil
	}
	return cmd
}

// The ids explain takes, as the API gives them.
var (
	flowID = regexp.MustCompile(`^[0-9]+$`)
	peerID = regexp.MustCompile(`^p[0-9a-f]{12}$`)
)

func lookupError(err error, what, id, target string) error {
	switch {
	case errors.Is(err, api.ErrNotFound) && what == "request":
		return fmt.Errorf("no request %s: the daemon keeps the most recent ones only (list them with `lattrace requests --trees`)", id)
	case errors.Is(err, api.ErrNotFound):
		return fmt.Errorf("no %s %s: it closed, expired or was never seen (list them with `lattrace flows%s`)", what, id, map[bool]string{true: " --peers"}[what == "peer pair"])
	}
	return clientError(err, target)
}

// explanation is what explain says about one flow or peer pair.
type explanation struct {
	title     string
	m         *aggregate.Metrics
	split     record.Split
	diagnoses []record.Diagnosis
	whatIf    time.Duration
	// inFlight describes the exchange in progress, if any.
	inFlight string
}

func flowExplanation(d *api.FlowDetail) explanation {
	f := &d.Flow
	who := f.Owner.Comm
	if f.Owner.PID != 0 {
		who = fmt.Sprintf("%s (pid %d)", f.Owner.Comm, f.Owner.PID)
	}
	role := string(f.ConnRole)
	if f.ConnRole == record.RoleUnknown || role == "" {
		role = "opened before lattrace started"
	}
	if k := f.Owner.K8s; k != nil {
		who += ", " + k8sText(k)
	}
	remote := f.Flow.Remote.String()
	if k := f.PeerK8s; k != nil {
		remote += " (" + k8sText(k) + ")"
	}
	e := explanation{
		title:     fmt.Sprintf("Flow %s: %s, %s -> %s, %s", f.ID, who, f.Flow.Local, remote, role),
		m:         &f.Metrics,
		split:     f.Split,
		diagnoses: f.Diagnoses,
	}
	if in := f.InFlight; in != nil && in.Start != 0 {
		e.inFlight = fmt.Sprintf("In progress: %s exchange begun %s ago, %s out and %s in so far (cwnd %d, srtt %s).",
			article(string(in.Role)), diagnose.Dur(d.Now.Sub(in.Start)), bytesText(in.BytesOut), bytesText(in.BytesIn), in.Cwnd, diagnose.Dur(in.SRTT))
	}
	return e
}

// k8sText names a pod or Service the way kubectl does.
func k8sText(k *record.K8s) string {
	var parts []string
	if k.Pod != "" {
		parts = append(parts, "pod "+k.Namespace+"/"+k.Pod)
	}
	if k.Workload != "" {
		parts = append(parts, strings.ToLower(k.WorkloadKind)+" "+k.Workload)
	}
	if k.Service != "" {
		parts = append(parts, "service "+k.Namespace+"/"+k.Service)
	}
	return strings.Join(parts, ", ")
}

func article(role string) string {
	if role == "" {
		return "an"
	}
	return "a " + role
}

func peerExplanation(d *api.PeerDetail) explanation {
	p := &d.Peer
	var pair string
	if p.Side == record.RoleServer {
		pair = fmt.Sprintf("%s serving :%d to %s", p.Comm, p.LocalPort, p.Remote)
	} else {
		pair = fmt.Sprintf("%s calling %s", p.Comm, fmtAddrPort(p.Remote.String(), p.RemotePort))
	}
	return explanation{
		title:     fmt.Sprintf("Peer pair %s: %s, %s", p.ID, pair, plural(p.Connections, "connection")),
		m:         &p.Metrics,
		split:     p.Split,
		diagnoses: p.Diagnoses,
	}
}

func fmtAddrPort(addr string, port uint16) string {
	if strings.Contains(addr, ":") {
		return fmt.Sprintf("[%s]:%d", addr, port)
	}
	return fmt.Sprintf("%s:%d", addr, port)
}

func (e explanation) write(w io.Writer) {
	m := e.m
	dur := diagnose.Dur
	fmt.Fprintln(w, e.title)
	if e.inFlight != "" {
		fmt.Fprintln(w, e.inFlight)
	}
	timed := m.Timed()
	if timed == 0 {
		fmt.Fprintf(w, "\nNo complete exchange yet (%d seen, %d begun before lattrace started, %d unanswered at close, %d cut from overlapping messages, %d pushed, %d unfinished at a daemon's stop, %d refused by the model's guard): nothing to explain yet.\n", m.Exchanges, m.Partial, m.Unanswered, m.Multiplexed, m.Pushes, m.Unfinished, m.Rejected)
		return
	}
	fmt.Fprintf(w, "%s: p50 %s, p99 %s, max %s; %s sent, %s received, %s\n",
		plural(m.Exchanges, "exchange"), dur(m.Duration.P50), dur(m.Duration.P99), dur(m.Duration.Max),
		bytesText(m.Out.Bytes), bytesText(m.In.Bytes), plural(m.Retransmits, "retransmission"))

	c := m.ComponentMeans
	total := e.split.Total()
	share := func(d time.Duration) string {
		if total <= 0 {
			return "  -"
		}
		return fmt.Sprintf("%3.0f %%", 100*float64(d)/float64(total))
	}
	fmt.Fprintf(w, "\nWhere the time goes (mean exchange %s):\n", dur(total))
	fmt.Fprintf(w, "  network    %9s %s  propagation %s + queueing %s\n", dur(e.split.Network), share(e.split.Network), dur(c.Propagation), dur(c.Queueing))
	fmt.Fprintf(w, "  transport  %9s %s  send wait %s (cwnd %s, rwnd %s, sndbuf %s, pacing %s, flow control %s, other %s), loss recovery %s, handshake %s, receive %s\n",
		dur(e.split.Transport), share(e.split.Transport), dur(c.SendWait), dur(c.SendWaitCwnd), dur(c.SendWaitRwnd),
		dur(c.SendWaitSndbuf), dur(c.SendWaitPacing), dur(c.SendWaitFlowControl), dur(c.SendWaitOther), dur(c.LossRecovery), dur(c.Handshake), dur(c.Receive))
	fmt.Fprintf(w, "  app        %9s %s  peer %s, local read %s, local think %s\n", dur(e.split.App), share(e.split.App), dur(c.Peer), dur(c.LocalRead), dur(c.Think))
	if d := e.split.Dominant(); d != "" {
		fmt.Fprintf(w, "  Most of it is %s.\n", d)
	}

	if len(e.diagnoses) == 0 {
		fmt.Fprintln(w, "\nNothing stands out: no part of the latency is above what a healthy path and an immediate peer give.")
	} else {
		fmt.Fprintln(w, "\nWhat stands out:")
		for i, d := range e.diagnoses {
			fmt.Fprintf(w, "  %d. %s (%s, %.0f %% of the latency): %s.\n", i+1, d.Name, d.Severity, 100*d.Share, d.Summary)
			fmt.Fprintf(w, "     Fix: %s.\n", d.Fix)
			var ev []string
			for _, x := range d.Evidence {
				ev = append(ev, evidenceText(x))
			}
			fmt.Fprintf(w, "     Numbers: %s\n", strings.Join(ev, ", "))
			for _, r := range d.Related {
				fmt.Fprintf(w, "     Related: %s\n", r)
			}
		}
	}
	if e.whatIf > 0 {
		extra, rounds := diagnose.WhatIf(m, e.whatIf)
		fmt.Fprintf(w, "\nWhat if the peer were %s further away (round trip): each exchange waits for %.1f round trips (one per two turns, plus handshakes), so it would take about %s longer: %s instead of %s on average.\n",
			dur(e.whatIf), rounds, dur(extra), dur(total+extra), dur(total))
		if m.Turns.Bursts > 0 && m.Turns.ExchangesPerBurstMean > 1 {
			extra, rounds := diagnose.WhatIfBurst(m, e.whatIf)
			fmt.Fprintf(w, "Its exchanges come in bursts of %.1f back to back (what the application waits for as one request): each burst waits for %.1f round trips, so it would take about %s longer.\n",
				m.Turns.ExchangesPerBurstMean, rounds, dur(extra))
		}
	}
}

func plural(n uint64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func evidenceText(x record.Evidence) string {
	switch x.Unit {
	case "ms":
		return fmt.Sprintf("%s %s", x.Name, diagnose.Dur(time.Duration(x.Value*1e6)))
	case "%":
		return fmt.Sprintf("%s %.0f %%", x.Name, x.Value)
	case "bytes/s":
		return fmt.Sprintf("%s %s/s", x.Name, bytesText(uint64(x.Value)))
	case "":
		if x.Value == 0 || x.Value == 1 {
			return fmt.Sprintf("%s=%d", x.Name, int(x.Value))
		}
		return fmt.Sprintf("%s %.1f", x.Name, x.Value)
	}
	return fmt.Sprintf("%s %.0f", x.Name, x.Value)
}

func bytesText(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}
