// Command netlab runs an emulated network path between two namespaces until
// interrupted, for trying the tracer by hand:
//
//	go run ./tests/netlab/cmd/netlab up --delay 10ms --rate 10mbit --loss 0.01
//	ip netns exec <printed netns of A> ping 10.99.0.2
//
// Flags without a suffix set both directions; -ab and -ba variants (e.g.
// --rate-ab 10mbit) override one direction whatever their order.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/lattrace/lattrace/tests/netlab"
)

const usage = `usage: netlab up [flags]    build a lab and run it until SIGINT/SIGTERM
       netlab reap          delete labs left behind by dead processes

flags of up (no suffix: both directions; -ab / -ba: one direction, wins over both):
  --delay D       one-way delay (e.g. 10ms)           --jitter D   uniform +-D, FIFO kept
  --loss P        drop probability 0..1               --rate R     e.g. 10mbit, 0 = unlimited (IP bytes)
  --queue SIZE    bytes waiting for serialization, e.g. 1MB (0 = 100 ms of rate, >= 64KiB)
  --mtu N         MTU of the veths (1500)             --seed N     seed for loss and jitter (0 = random)
  --prefix NAME   namespaces NAME-a, NAME-b, NAME-m (default: unique, reaped after a crash)
  --stats D       print counters every D (0 = only at exit)
`

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "netlab:", err)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ error }

func run(args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return usageError{errors.New("missing command (up or reap)")}
	}
	switch args[0] {
	case "up":
		return up(args[1:])
	case "reap":
		removed, err := netlab.ReapStale()
		for _, n := range removed {
			fmt.Println("removed", n)
		}
		return err
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return nil
	}
	return usageError{fmt.Errorf("unknown command %q (want up or reap; -h for help)", args[0])}
}

// linkFlags holds one direction's flag values; nil means "not given".
type linkFlags struct {
	delay, jitter *time.Duration
	loss          *float64
	rate          *int64
	queue         *int
}

func (f linkFlags) apply(l *netlab.Link) {
	if f.delay != nil {
		l.Delay = *f.delay
	}
	if f.jitter != nil {
		l.Jitter = *f.jitter
	}
	if f.loss != nil {
		l.Loss = *f.loss
	}
	if f.rate != nil {
		l.RateBitsPerSec = *f.rate
	}
	if f.queue != nil {
		l.QueueLimitBytes = *f.queue
	}
}

// parsed registers a flag whose value is checked when parsed, so a bad value
// is reported by name in one line.
func parsed[T any](fs *flag.FlagSet, name, help string, dst **T, parse func(string) (T, error)) {
	fs.Func(name, help, func(s string) error {
		v, err := parse(s)
		if err != nil {
			return err
		}
		*dst = &v
		return nil
	})
}

func duration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("bad duration %q (want e.g. 10ms, 1.5s)", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("duration %q is negative", s)
	}
	return d, nil
}

func probability(s string) (float64, error) {
	p, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("bad probability %q (want 0..1, e.g. 0.01)", s)
	}
	if !(p >= 0 && p <= 1) {
		return 0, fmt.Errorf("loss %s is outside 0..1 (0.01 means 1 %%)", s)
	}
	return p, nil
}

func registerLink(fs *flag.FlagSet, suffix, what string, f *linkFlags) {
	parsed(fs, "delay"+suffix, "one-way delay "+what, &f.delay, duration)
	parsed(fs, "jitter"+suffix, "jitter "+what, &f.jitter, duration)
	parsed(fs, "loss"+suffix, "loss probability "+what, &f.loss, probability)
	parsed(fs, "rate"+suffix, "rate "+what, &f.rate, netlab.ParseRate)
	parsed(fs, "queue"+suffix, "queue limit "+what, &f.queue, netlab.ParseBytes)
}

func up(args []string) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are printed once, by main
	fs.Usage = func() {}
	var both, ab, ba linkFlags
	registerLink(fs, "", "(both directions)", &both)
	registerLink(fs, "-ab", "(A to B)", &ab)
	registerLink(fs, "-ba", "(B to A)", &ba)
	var cfg netlab.Config
	fs.StringVar(&cfg.Prefix, "prefix", "", "namespace prefix")
	fs.IntVar(&cfg.MTU, "mtu", 1500, "MTU")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "random seed")
	statsEvery := fs.Duration("stats", 0, "print counters this often")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Print(usage)
			return nil
		}
		return usageError{fmt.Errorf("%v (netlab -h for help)", err)}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q (netlab -h for help)", fs.Arg(0))}
	}
	if *statsEvery < 0 {
		return usageError{errors.New("--stats is negative")}
	}
	both.apply(&cfg.AtoB)
	both.apply(&cfg.BtoA)
	ab.apply(&cfg.AtoB)
	ba.apply(&cfg.BtoA)
	for _, c := range []struct {
		name string
		l    netlab.Link
	}{{"A->B", cfg.AtoB}, {"B->A", cfg.BtoA}} {
		if err := c.l.Validate(); err != nil {
			return usageError{fmt.Errorf("%s: %v", c.name, err)}
		}
	}

	// Signals are caught before the lab exists so that an early Ctrl-C
	// still goes through Close.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	lab, err := netlab.New(cfg)
	if err != nil {
		return err
	}
	defer lab.Close()
	fmt.Printf("A:     netns %-22s dev %s  %s  %s\n", lab.A.Netns, lab.A.Ifname, lab.A.IPv4, lab.A.IPv6)
	fmt.Printf("B:     netns %-22s dev %s  %s  %s\n", lab.B.Netns, lab.B.Ifname, lab.B.IPv4, lab.B.IPv6)
	fmt.Printf("relay: netns %-22s dev ma0 (A side), mb0 (B side)\n", lab.Middle)
	fmt.Printf("A->B:  %v\nB->A:  %v\n", cfg.AtoB, cfg.BtoA)
	fmt.Printf("try:   ip netns exec %s ping %s\n", lab.A.Netns, lab.B.IPv4)
	fmt.Println("running; SIGINT/SIGTERM to stop and clean up")

	var tick <-chan time.Time
	if *statsEvery > 0 {
		t := time.NewTicker(*statsEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-tick:
			printStats(lab)
		case s := <-sig:
			fmt.Printf("%v: stopping\n", s)
			printStats(lab)
			return lab.Close()
		}
	}
}

func printStats(lab *netlab.Lab) {
	atob, btoa := lab.Stats()
	for _, d := range []struct {
		name string
		s    netlab.LinkStats
	}{{"A->B", atob}, {"B->A", btoa}} {
		s := d.s
		fmt.Printf("%s: %d frames %d bytes forwarded; dropped: loss %d, queue %d, relay %d; queue %d B, pending %d\n",
			d.name, s.Frames, s.Bytes, s.LossDrops, s.QueueDrops, s.KernelDrops+s.SendErrors, s.QueueBytes, s.Pending)
	}
}
