package csi

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
)

// listenTakeover listens on the unix socket path, taking the name over
// from any socket there (an earlier process's, or the pod being replaced
// during a rolling update with surge). It returns the listener and the
// name as it was when it became ours, to tell later whether it still is
// (another process may take it over in turn): remove it only then.
//
// The socket is bound under a temporary name in the same directory and
// renamed over path. Listening on path and then stat'ing it left a gap in
// which a second process could remove and rebind the name: the first then
// took the second's socket for its own and removed it on exit
// (TestSocketTakeover, once under load). The rename also leaves no moment
// without a socket at path. The temporary name starts with a dot, which
// kubelet's plugin watcher ignores, and is one byte longer than
// "csi.sock", within a socket path's 108 bytes wherever path is.
func listenTakeover(path string) (*net.UnixListener, ownedName, error) {
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%08x", rand.Uint32()))
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, ownedName{}, fmt.Errorf("listen on %s: %w", path, err)
	}
	lis := l.(*net.UnixListener)
	// The name is ours to remove only while it is ours (see above); Go
	// would unlink it blindly on Close.
	lis.SetUnlinkOnClose(false)
	ours, err := os.Stat(tmp)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		lis.Close()
		os.Remove(tmp)
		return nil, ownedName{}, fmt.Errorf("take over %s: %w", path, err)
	}
	return lis, ownedName{path, ours}, nil
}

// ownedName is a socket's path and the file this process put there.
type ownedName struct {
	path string
	ours os.FileInfo
}

// stillOurs tells whether the path still names this process's socket.
func (n ownedName) stillOurs() bool {
	now, err := os.Stat(n.path)
	return err == nil && os.SameFile(n.ours, now)
}

// removeIfOurs removes the path unless another process took it over.
func (n ownedName) removeIfOurs() {
	if n.stillOurs() {
		os.Remove(n.path)
	}
}
