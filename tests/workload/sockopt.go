package workload

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// bufControl returns a net.Dialer/ListenConfig Control function that sets
// SO_RCVBUF and SO_SNDBUF (when > 0) before connect/listen, so that the
// receive buffer also shapes the advertised window scale. Accepted sockets
// inherit the listener's values. The kernel doubles the value given.
func bufControl(rcvbuf, sndbuf int) func(network, address string, c syscall.RawConn) error {
	if rcvbuf <= 0 && sndbuf <= 0 {
		return nil
	}
	return func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if rcvbuf > 0 {
				if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf); e != nil {
					serr = e
					return
				}
			}
			if sndbuf > 0 {
				if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, sndbuf); e != nil {
					serr = e
				}
			}
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
