package workload

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// sockControl returns a net.Dialer/ListenConfig Control function that sets,
// before connect or listen, SO_RCVBUF and SO_SNDBUF (when > 0), so that the
// receive buffer also shapes the advertised window scale, and
// SO_MAX_PACING_RATE (bytes per second, when > 0). Accepted sockets inherit
// the listener's values. The kernel doubles the buffer sizes given.
func sockControl(rcvbuf, sndbuf int, pacing int64) func(network, address string, c syscall.RawConn) error {
	if rcvbuf <= 0 && sndbuf <= 0 && pacing <= 0 {
		return nil
	}
	return func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			set := func(opt, v int) {
				if v > 0 && serr == nil {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, v)
				}
			}
			set(unix.SO_RCVBUF, rcvbuf)
			set(unix.SO_SNDBUF, sndbuf)
			set(unix.SO_MAX_PACING_RATE, int(pacing))
		})
		if err != nil {
			return err
		}
		return serr
	}
}

// setNoDelay sets TCP_NODELAY on c (if it is a TCP connection).
func setNoDelay(c net.Conn, on bool) error {
	if tc, ok := c.(*net.TCPConn); ok {
		return tc.SetNoDelay(on)
	}
	return nil
}

// socketBufs returns SO_RCVBUF and SO_SNDBUF of a TCP connection as the
// kernel reports them.
func socketBufs(c net.Conn) (rcv, snd int, err error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return 0, 0, nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var gerr error
	err = raw.Control(func(fd uintptr) {
		rcv, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		if gerr == nil {
			snd, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
		}
	})
	if err == nil {
		err = gerr
	}
	return rcv, snd, err
}
