// Command grpcapp is the gRPC workload of lattrace's tests: grpc-go at its
// defaults (BDP pings on, its own flow-control windows), over cleartext
// HTTP/2. It has no generated code: the service is declared by hand and
// messages are raw bytes (a codec of its own), which changes nothing of
// what crosses the connection but the message bodies.
//
//	grpcapp server -addr 10.0.0.2:50051 -think 13ms -stream-every 200ms [-window 65536] [-cert c.pem -key k.pem] [-log handled.log]
//	grpcapp client -addr 10.0.0.2:50051 -mode unary|concurrent|stream -n 200 -c 8 -log calls.log [-tls]
//
// The client writes one line per call to -log: the call's duration in
// microseconds, from its start to its answer's end, as the client saw it,
// and its start in microseconds since the Unix epoch.
// The server writes one line per call to its -log as the call ends: the
// time its handler took, in microseconds, from its start to its return.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
)

// rawCodec carries messages as they are: []byte both ways.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("raw codec: %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "raw" }

func init() { encoding.RegisterCodec(rawCodec{}) }

type server struct {
	think, every time.Duration
	messages     int
	size         int

	mu      sync.Mutex
	handled *os.File // -log, or nil
}

// logHandled writes a handler's time as the call ends.
func (s *server) logHandled(start time.Time) {
	if s.handled == nil {
		return
	}
	d := time.Since(start)
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintln(s.handled, d.Microseconds())
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: "lattrace.test.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Unary",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			s := srv.(*server)
			defer s.logHandled(time.Now())
			var in []byte
			if err := dec(&in); err != nil {
				return nil, err
			}
			time.Sleep(s.think)
			out := make([]byte, s.size)
			return &out, nil
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Stream",
		ServerStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			s := srv.(*server)
			defer s.logHandled(time.Now())
			var in []byte
			if err := stream.RecvMsg(&in); err != nil {
				return err
			}
			time.Sleep(s.think)
			out := make([]byte, s.size)
			for i := 0; i < s.messages; i++ {
				if i > 0 {
					time.Sleep(s.every)
				}
				if err := stream.SendMsg(&out); err != nil {
					return err
				}
			}
			return nil
		},
	}},
}

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: grpcapp server|client [flags]")
	}
	switch os.Args[1] {
	case "server":
		runServer(os.Args[2:])
	case "client":
		runClient(os.Args[2:])
	default:
		log.Fatalf("grpcapp: unknown command %q (server or client)", os.Args[1])
	}
}

func runServer(args []string) {
	fs := flag.NewFlagSet("server", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:50051", "listen address")
	s := &server{}
	fs.DurationVar(&s.think, "think", 0, "time the server takes before it answers")
	fs.DurationVar(&s.every, "stream-every", 200*time.Millisecond, "time between a streamed answer's messages")
	fs.IntVar(&s.messages, "stream-messages", 20, "messages of a streamed answer")
	fs.IntVar(&s.size, "size", 100, "bytes of each answer message")
	window := fs.Int("window", 0, "HTTP/2 receive window of each stream and of the connection, bytes (0: grpc-go's, which grows with its BDP estimate; 65536 at least)")
	cert := fs.String("cert", "", "TLS certificate (PEM); with -key, serve gRPC over TLS")
	key := fs.String("key", "", "TLS key (PEM)")
	logPath := fs.String("log", "", "file for each call's handler time in microseconds")
	_ = fs.Parse(args)
	if *logPath != "" {
		f, err := os.Create(*logPath)
		if err != nil {
			log.Fatal(err)
		}
		s.handled = f
	}
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	opts := []grpc.ServerOption{grpc.ForceServerCodec(rawCodec{}), grpc.MaxRecvMsgSize(64 << 20)}
	if *window > 0 {
		// A fixed window: grpc-go's BDP estimation is off.
		opts = append(opts, grpc.InitialWindowSize(int32(*window)), grpc.InitialConnWindowSize(int32(*window)))
	}
	if *cert != "" {
		pair, err := tls.LoadX509KeyPair(*cert, *key)
		if err != nil {
			log.Fatal(err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}})))
	}
	g := grpc.NewServer(opts...)
	g.RegisterService(&serviceDesc, s)
	log.Fatal(g.Serve(l))
}

func runClient(args []string) {
	fs := flag.NewFlagSet("client", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:50051", "server address")
	mode := fs.String("mode", "unary", "unary (one call at a time), concurrent (-c callers), stream (server streaming)")
	n := fs.Int("n", 200, "calls")
	c := fs.Int("c", 8, "concurrent callers (mode concurrent)")
	size := fs.Int("size", 100, "bytes of each request")
	logPath := fs.String("log", "", "file for each call's duration in microseconds")
	useTLS := fs.Bool("tls", false, "gRPC over TLS (the server's certificate is not verified)")
	_ = fs.Parse(args)
	creds := insecure.NewCredentials()
	if *useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	req := make([]byte, *size)
	call := func() (time.Duration, error) {
		start := time.Now()
		var resp []byte
		if *mode != "stream" {
			err := conn.Invoke(context.Background(), "/lattrace.test.Echo/Unary", &req, &resp)
			return time.Since(start), err
		}
		st, err := conn.NewStream(context.Background(), &serviceDesc.Streams[0], "/lattrace.test.Echo/Stream")
		if err != nil {
			return 0, err
		}
		if err := st.SendMsg(&req); err != nil {
			return 0, err
		}
		if err := st.CloseSend(); err != nil {
			return 0, err
		}
		for {
			if err := st.RecvMsg(&resp); errors.Is(err, io.EOF) {
				return time.Since(start), nil
			} else if err != nil {
				return 0, err
			}
		}
	}
	callers := 1
	if *mode == "concurrent" {
		callers = *c
	}
	var mu sync.Mutex
	var durs []time.Duration
	var starts []time.Time
	var wg sync.WaitGroup
	for w := 0; w < callers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < *n; i += callers {
				start := time.Now()
				d, err := call()
				if err != nil {
					log.Fatalf("call %d: %v", i, err)
				}
				mu.Lock()
				durs = append(durs, d)
				starts = append(starts, start)
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	if *logPath != "" {
		f, err := os.Create(*logPath)
		if err != nil {
			log.Fatal(err)
		}
		for i, d := range durs {
			fmt.Fprintln(f, d.Microseconds(), starts[i].UnixMicro())
		}
		if err := f.Close(); err != nil {
			log.Fatal(err)
		}
	}
}
