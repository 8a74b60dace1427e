// Package private opens the files and directories the daemon keeps to its
// own user (root): the API socket's directory, the pin directory, the
// JSON lines output, a recording, a CPU profile. The daemon runs as root,
// so a path another user prepared for it (a directory they own, a symbolic
// link, a hard link to another file) would have it listen where they can
// reach, pin where they can unpin, or write over a file they cannot: each
// such path is refused with one line that names it and says why.
package private

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// MkdirAll creates dir (mode 0700) and its missing parents, then checks it
// as Dir does. Nothing is created under a directory another user could
// change.
func MkdirAll(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	d := dir
	for ; d != filepath.Dir(d); d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			break
		}
	}
	if d != dir {
		if err := ancestors(d); err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return Dir(dir)
}

// Dir checks that only this process's user (or root) can change what is in
// dir: dir is a directory, not a symbolic link, owned by that user or root
// and writable by no one else, and every directory above it, as written and
// with its links resolved, is owned by that user or root and writable by
// no one else unless it is sticky (/tmp: others may add names there but not
// take away or rename dir).
func Dir(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return &fs.PathError{Op: "lstat", Path: dir, Err: err}
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return fmt.Errorf("%s is a symbolic link: whoever owns it could point it elsewhere", dir)
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("%s is not a directory", dir)
	case st.Uid != 0 && int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s is owned by uid %d, not by this process's uid %d or root", dir, st.Uid, os.Geteuid())
	case st.Mode&0o022 != 0:
		return fmt.Errorf("%s is writable by other users (mode %04o)", dir, st.Mode&0o7777)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	for _, d := range []string{filepath.Dir(dir), filepath.Dir(real)} {
		if err := ancestors(d); err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
	}
	return nil
}

// ancestors checks d and each directory above it: owned by root or this
// process's user, and writable by no one else unless sticky.
func ancestors(d string) error {
	for {
		var st unix.Stat_t
		if err := unix.Lstat(d, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: d, Err: err}
		}
		if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
			return fmt.Errorf("%s above it is owned by uid %d, who could replace what is below", d, st.Uid)
		}
		// A link's own mode means nothing; its parent is checked next.
		if st.Mode&unix.S_IFMT != unix.S_IFLNK && st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
			return fmt.Errorf("%s above it is writable by other users (mode %04o), who could replace what is below", d, st.Mode&0o7777)
		}
		if d == filepath.Dir(d) {
			return nil
		}
		d = filepath.Dir(d)
	}
}

// Create opens path to write with flag (os.O_APPEND or os.O_TRUNC),
// creating it with mode 0600. An existing path must be this process's
// user's or root's, and a regular file with no other name, a pipe or a
// device: never a symbolic link (whoever made it could point it at any
// file) nor a hard link (a second name of a file kept elsewhere). It is
// truncated only once it passed, and a pipe is not waited on: another
// user's would hold the daemon at its start.
func Create(path string, flag int) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|flag&^os.O_TRUNC, 0o600)
	var st unix.Stat_t
	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, fmt.Errorf("%s is a symbolic link: whoever made it could point it at any file; give the file's own path", path)
	case errors.Is(err, unix.ENXIO) && unix.Lstat(path, &st) == nil:
		// A pipe nobody reads yet.
		if err := check(&st); err != nil {
			return nil, fmt.Errorf("%s %w", path, err)
		}
		return nil, fmt.Errorf("%s is a pipe nobody reads", path)
	case err != nil:
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	if err = unix.Fstat(fd, &st); err == nil {
		err = check(&st)
	}
	if err == nil && flag&os.O_TRUNC != 0 {
		err = unix.Ftruncate(fd, 0)
	}
	if err == nil {
		err = unix.SetNonblock(fd, false)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%s %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// check says what is wrong with a file to write, if anything.
func check(st *unix.Stat_t) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if st.Nlink > 1 {
			return fmt.Errorf("has %d hard links: it is also another file", st.Nlink)
		}
	case unix.S_IFIFO, unix.S_IFCHR:
	default:
		return fmt.Errorf("is not a regular file")
	}
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("is owned by uid %d, not by this process's uid %d or root", st.Uid, os.Geteuid())
	}
	return nil
}
