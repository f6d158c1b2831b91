package handoff

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The keeper holds FUSE connections across restarts of the process serving
// them.
//
// While any process holds a mount's /dev/fuse fd, the kernel keeps the mount
// alive: when its server dies, requests wait instead of failing. The keeper
// is a small process that holds, per mount, a dup of that fd, the mount's
// state region (a memfd) and an opaque record from the server (in the CSI
// driver: volume, paths, options and credentials — in memory only). It never
// reads or writes the fd: the data path is the server's alone.
//
// Protocol: a SOCK_SEQPACKET unix socket; each message is one JSON object,
// with fds attached as SCM_RIGHTS. A server (client here) asks:
//
//	hold {key, record} + [fuse fd, state fd]   keep (or replace) a mount
//	drop {key}                                 forget a mount (unmounted)
//	adopt                                      become the owner: the keeper
//	                                           answers with one "mount"
//	                                           message per mount, then "end"
//	attach {keys}                              reconnected owner: these are
//	                                           the mounts it still serves
//	released                                   answer to release
//
// and gets "ok" or "error" for each, except adopt. Ownership: one server
// serves the mounts at a time. When another server adopts, the keeper first
// sends "release" to the owner, which stops reading its mounts between
// requests and answers "released" (or dies); only then are the mounts handed
// over, so two processes never journal into one state region.
//
// Access: the records hold credentials, so the keeper answers only
// processes of its own effective user, checked (SO_PEERCRED) on every
// connection it accepts; others are logged and hung up on. The socket file
// has mode 0600 from the moment it can be reached (listenPrivate), so that
// other users cannot even connect where the file system's permissions
// apply.
//
// Upgrades: a keeper that starts while another listens on its socket asks
// it to hand over ("handoff"): the old keeper sends every mount, stops
// listening and drops its connections, then idles until it is killed (a
// restart would take the mounts back). The owner reconnects to the new
// keeper and attaches; a server adopting meanwhile waits for that (up to
// ownerReturnTimeout) so that it never serves beside the owner.

const (
	keeperMaxMessage = 64 << 10
	// ownerReturnTimeout bounds how long an adopter waits, after a keeper
	// handoff, for the previous owner to reconnect and release.
	ownerReturnTimeout = 15 * time.Second
	// releaseTimeout bounds how long the owner may take to release.
	releaseTimeout = 2 * time.Minute
)

// keeperMsg is one protocol message.
type keeperMsg struct {
	Op     string   `json:"op"`
	Key    string   `json:"key,omitempty"`
	Keys   []string `json:"keys,omitempty"`
	Record []byte   `json:"record,omitempty"`
	// Owned (in a handoff) says that a server owned the mount.
	Owned bool   `json:"owned,omitempty"`
	Error string `json:"error,omitempty"`
	// UnservedNS (in "end" of an adopt) is how long the mounts have gone
	// unserved: since their previous owner released them or died.
	UnservedNS int64 `json:"unservedNs,omitempty"`
}

// seqConn is one end of a SOCK_SEQPACKET connection.
type seqConn struct {
	c *net.UnixConn
}

func (sc seqConn) send(m keeperMsg, fds ...int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(b) > keeperMaxMessage {
		return fmt.Errorf("keeper message %q of %d bytes is too large", m.Op, len(b))
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err = sc.c.WriteMsgUnix(b, oob, nil)
	return err
}

// recv reads one message and the fds attached to it (owned by the caller).
func (sc seqConn) recv() (keeperMsg, []int, error) {
	buf := make([]byte, keeperMaxMessage)
	oob := make([]byte, unix.CmsgSpace(4*8))
	n, oobn, _, _, err := sc.c.ReadMsgUnix(buf, oob)
	if err != nil {
		return keeperMsg{}, nil, err
	}
	var fds []int
	if oobn > 0 {
		cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return keeperMsg{}, nil, err
		}
		for _, cm := range cmsgs {
			got, err := unix.ParseUnixRights(&cm)
			if err != nil {
				continue
			}
			for _, fd := range got {
				unix.CloseOnExec(fd)
			}
			fds = append(fds, got...)
		}
	}
	if n == 0 {
		closeFDs(fds)
		return keeperMsg{}, nil, errors.New("keeper connection closed")
	}
	var m keeperMsg
	if err := json.Unmarshal(buf[:n], &m); err != nil {
		closeFDs(fds)
		return keeperMsg{}, nil, fmt.Errorf("keeper message: %w", err)
	}
	return m, fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func dialSeq(path string) (seqConn, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return seqConn{}, err
	}
	return seqConn{c}, nil
}

// --- the keeper process ------------------------------------------------

// Keeper is the keeper's side: see the comment at the top of this file.
// mu guards everything below it.
type Keeper struct {
	path string
	log  *slog.Logger

	mu     sync.Mutex
	cond   *sync.Cond // signalled when owner or ownerReturnBy changes
	mounts map[string]*keptMount
	owner  *keeperConn
	// ownerReturnBy is set after a handoff: the previous owner is expected
	// to reconnect before it.
	ownerReturnBy time.Time
	conns         map[*keeperConn]bool
	handedOff     bool
	// unservedSince is when the last owner released its mounts or went
	// away; the next adopter is told how long ago (the restart's pause).
	unservedSince time.Time
	ln            *net.UnixListener
	// refusedPeers are the (pid, uid) pairs refused and logged already.
	refusedPeers map[[2]int64]bool
}

type keptMount struct {
	key     string
	fuseFD  int
	stateFD int
	record  []byte
}

func (m *keptMount) close() {
	unix.Close(m.fuseFD)
	unix.Close(m.stateFD)
}

// keeperConn is one connected server.
type keeperConn struct {
	seqConn
	// pid is the peer's process id: a server that reconnects is told
	// from another one by it.
	pid int32
	// released is closed when this connection answered "released" or
	// went away.
	released     chan struct{}
	releaseAsked bool
	gone         bool
}

// NewKeeper prepares a keeper for the socket at path. Run listens.
func NewKeeper(path string, log *slog.Logger) *Keeper {
	if log == nil {
		log = slog.Default()
	}
	k := &Keeper{path: path, log: log, mounts: map[string]*keptMount{}, conns: map[*keeperConn]bool{}}
	k.cond = sync.NewCond(&k.mu)
	return k
}

// Run takes the mounts over from a keeper already listening on the socket
// (if any), listens, and serves until ctx ends. After a handoff to a newer
// keeper it idles until ctx ends. On return the keeper's fds are closed: the
// mounts live on while their server holds them.
func (k *Keeper) Run(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(k.path), 0o750); err != nil {
		return err
	}
	if err := k.takeOver(); err != nil {
		return err
	}
	ln, err := listenPrivate(k.path)
	if err != nil {
		return fmt.Errorf("keeper: listen on %s: %w", k.path, err)
	}
	k.mu.Lock()
	k.ln = ln
	n := len(k.mounts)
	k.mu.Unlock()
	k.log.Info("keeper listening", "socket", k.path, "mounts", n)
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	euid := os.Geteuid()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			k.mu.Lock()
			handedOff := k.handedOff
			k.mu.Unlock()
			if handedOff {
				// Idle: a kubelet restart of this container would start a
				// keeper that takes the mounts back from the new one.
				k.log.Info("mounts handed to a newer keeper; idling until stopped")
				<-ctx.Done()
				return nil
			}
			if ctx.Err() != nil {
				k.closeAll()
				return nil
			}
			return fmt.Errorf("keeper: accept: %w", err)
		}
		cred, err := peerCred(c)
		if err != nil || int(cred.Uid) != euid {
			// Every mount's record, credentials included, goes to
			// whoever adopts: only the driver's own user may ask.
			k.refused(cred, err)
			c.Close()
			continue
		}
		kc := &keeperConn{seqConn: seqConn{c}, released: make(chan struct{}), pid: cred.Pid}
		k.mu.Lock()
		k.conns[kc] = true
		k.mu.Unlock()
		go k.serveConn(kc)
	}
}

// closeAll closes every connection and fd (the keeper is going away).
func (k *Keeper) closeAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for kc := range k.conns {
		kc.c.Close()
	}
	for _, m := range k.mounts {
		m.close()
	}
	k.mounts = map[string]*keptMount{}
}

// Mounts returns the keys of the mounts held, sorted.
func (k *Keeper) Mounts() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	keys := make([]string, 0, len(k.mounts))
	for key := range k.mounts {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return keys
}

// takeOver asks a keeper listening on the socket, if any, for its mounts.
func (k *Keeper) takeOver() error {
	sc, err := dialSeq(k.path)
	if err != nil {
		return nil // nobody there (or a stale socket file)
	}
	defer sc.c.Close()
	if err := sc.send(keeperMsg{Op: "handoff"}); err != nil {
		return fmt.Errorf("keeper handoff: %w", err)
	}
	owned := false
	for {
		m, fds, err := sc.recv()
		if err != nil {
			return fmt.Errorf("keeper handoff: %w", err)
		}
		switch m.Op {
		case "mount":
			if len(fds) != 2 {
				closeFDs(fds)
				return fmt.Errorf("keeper handoff: mount %q came with %d fds", m.Key, len(fds))
			}
			k.mounts[m.Key] = &keptMount{key: m.Key, fuseFD: fds[0], stateFD: fds[1], record: m.Record}
			owned = owned || m.Owned
		case "end":
			if owned {
				k.ownerReturnBy = time.Now().Add(ownerReturnTimeout)
			}
			k.log.Info("took the mounts over from the running keeper", "mounts", len(k.mounts))
			return nil
		case "error":
			return fmt.Errorf("keeper handoff: %s", m.Error)
		default:
			closeFDs(fds)
		}
	}
}

// listenPrivate listens on a unix socket at path that no other user can
// ever connect to. bind(2) creates the socket file with mode 0777 &^ umask,
// and a chmod after it leaves a window in which anyone may connect (and a
// connection made then stays open). The umask cannot be narrowed for the
// bind alone: it belongs to the whole process, and other goroutines create
// files meanwhile (in the CSI driver, and in tests that run a keeper in
// process). So the socket is bound inside a fresh directory of mode 0700,
// made 0600 there, and renamed into place: it becomes reachable at path
// only with its final mode. The rename also replaces a stale socket file
// (or one of a keeper that handed off) without a moment with no socket.
// The private directory is in path's directory, so the rename stays on one
// file system.
func listenPrivate(path string) (*net.UnixListener, error) {
	dir, err := os.MkdirTemp(filepath.Dir(path), "."+filepath.Base(path)+".bind-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: tmp, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	// The file outlives the listener: a keeper that handed off closes its
	// listener, and must not remove the socket its successor listens on.
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// peerCred returns the credentials of the process at the other end of c,
// as they were when it connected.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	cerr := raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cerr != nil {
		return nil, cerr
	}
	return cred, err
}

// maxRefusedPeers bounds the peers whose refusal is remembered (to log it
// once each).
const maxRefusedPeers = 256

// refused logs a connection refused from another user, once per process
// and user: a client that retries in a loop must not flood the log.
func (k *Keeper) refused(cred *unix.Ucred, err error) {
	if err != nil {
		k.log.Warn("keeper: refused a connection whose peer is unknown", "err", err)
		return
	}
	peer := [2]int64{int64(cred.Pid), int64(cred.Uid)}
	k.mu.Lock()
	if k.refusedPeers == nil || len(k.refusedPeers) >= maxRefusedPeers {
		k.refusedPeers = map[[2]int64]bool{}
	}
	seen := k.refusedPeers[peer]
	k.refusedPeers[peer] = true
	k.mu.Unlock()
	if !seen {
		k.log.Warn("keeper: refused a connection from another user", "pid", cred.Pid, "uid", cred.Uid, "want_uid", os.Geteuid())
	}
}

// takeOwnerLocked makes kc the owner if nobody else is: the owner's own
// earlier connection (same process, reconnected before the keeper saw the
// old one close) does not count.
func (k *Keeper) takeOwnerLocked(kc *keeperConn) bool {
	if o := k.owner; o != nil && o != kc {
		if o.pid == 0 || o.pid != kc.pid {
			return false
		}
		o.c.Close()
	}
	k.owner = kc
	return true
}

// releasedLocked records that kc's driver has released its mounts, or is
// gone: whoever waits for it (an adopter) goes on, and kc owns nothing.
func (k *Keeper) releasedLocked(kc *keeperConn) {
	if !kc.gone {
		kc.gone = true
		close(kc.released)
	}
	if k.owner == kc {
		k.owner = nil
		k.unservedSince = time.Now()
		k.log.Info("mounts unserved: their server released them or is gone", "mounts", len(k.mounts), "pid", kc.pid)
		k.cond.Broadcast()
	}
}

func (k *Keeper) serveConn(kc *keeperConn) {
	defer func() {
		kc.c.Close()
		k.mu.Lock()
		delete(k.conns, kc)
		k.releasedLocked(kc)
		k.mu.Unlock()
	}()
	for {
		m, fds, err := kc.recv()
		if err != nil {
			return
		}
		if !k.handle(kc, m, fds) {
			return
		}
	}
}

// handle answers one message; false ends the connection.
func (k *Keeper) handle(kc *keeperConn, m keeperMsg, fds []int) bool {
	k.mu.Lock()
	handedOff := k.handedOff
	k.mu.Unlock()
	if handedOff {
		// A newer keeper has the mounts: never answer for them.
		closeFDs(fds)
		return false
	}
	reply := func(err error) bool {
		if err != nil {
			return kc.send(keeperMsg{Op: "error", Error: err.Error()}) == nil
		}
		return kc.send(keeperMsg{Op: "ok"}) == nil
	}
	switch m.Op {
	case "hold":
		if len(fds) != 2 || m.Key == "" {
			closeFDs(fds)
			return reply(fmt.Errorf("hold needs a key and two fds (got %d)", len(fds)))
		}
		k.mu.Lock()
		if !k.takeOwnerLocked(kc) {
			k.mu.Unlock()
			closeFDs(fds)
			return reply(errors.New("another server owns the mounts"))
		}
		if old := k.mounts[m.Key]; old != nil {
			old.close()
		}
		k.mounts[m.Key] = &keptMount{key: m.Key, fuseFD: fds[0], stateFD: fds[1], record: m.Record}
		k.mu.Unlock()
		k.log.Info("holding mount", "key", m.Key)
		return reply(nil)
	case "drop":
		closeFDs(fds)
		k.mu.Lock()
		if !k.takeOwnerLocked(kc) {
			k.mu.Unlock()
			return reply(errors.New("another server owns the mounts"))
		}
		if old := k.mounts[m.Key]; old != nil {
			old.close()
			delete(k.mounts, m.Key)
			k.log.Info("dropped mount", "key", m.Key)
		}
		k.mu.Unlock()
		return reply(nil)
	case "attach":
		closeFDs(fds)
		k.mu.Lock()
		if !k.takeOwnerLocked(kc) {
			k.mu.Unlock()
			// Someone adopted while this server was away: it must stop.
			kc.send(keeperMsg{Op: "release"})
			return true
		}
		k.ownerReturnBy = time.Time{}
		k.cond.Broadcast()
		// The owner's list is the truth: what it unmounted while it was
		// away (during a keeper handoff) is dropped.
		serving := map[string]bool{}
		for _, key := range m.Keys {
			serving[key] = true
		}
		for key, km := range k.mounts {
			if !serving[key] {
				km.close()
				delete(k.mounts, key)
			}
		}
		k.mu.Unlock()
		return reply(nil)
	case "released":
		closeFDs(fds)
		k.mu.Lock()
		k.releasedLocked(kc)
		k.mu.Unlock()
		return true
	case "adopt":
		closeFDs(fds)
		if err := k.adopt(kc); err != nil {
			return reply(err)
		}
		return true
	case "handoff":
		closeFDs(fds)
		k.handoff(kc)
		return false
	default:
		closeFDs(fds)
		return reply(fmt.Errorf("unknown request %q", m.Op))
	}
}

// adopt makes kc the owner, after the previous owner released, and sends it
// every mount.
func (k *Keeper) adopt(kc *keeperConn) error {
	k.mu.Lock()
	// After a handoff, give the previous owner time to come back: it is
	// still serving, and must release before anyone else serves.
	for k.owner == nil && !k.ownerReturnBy.IsZero() && time.Now().Before(k.ownerReturnBy) {
		wake := time.AfterFunc(time.Until(k.ownerReturnBy), func() {
			k.mu.Lock()
			k.cond.Broadcast()
			k.mu.Unlock()
		})
		k.cond.Wait()
		wake.Stop()
	}
	k.ownerReturnBy = time.Time{}
	prev := k.owner
	if prev != nil && prev != kc {
		if !prev.releaseAsked {
			prev.releaseAsked = true
			if err := prev.send(keeperMsg{Op: "release"}); err != nil {
				prev.c.Close() // its reader ends and closes released
			}
		}
		k.mu.Unlock()
		k.log.Info("asking the serving process to release its mounts")
		start := time.Now()
		select {
		case <-prev.released:
		case <-time.After(releaseTimeout):
			return fmt.Errorf("the serving process did not release its mounts within %v", releaseTimeout)
		}
		k.log.Info("mounts released", "after", time.Since(start).Round(time.Millisecond))
		k.mu.Lock()
		if k.owner == prev {
			k.owner = nil
		}
		if k.handedOff {
			// The mounts went to a newer keeper meanwhile: adopt there.
			k.mu.Unlock()
			kc.c.Close()
			return nil
		}
	}
	if k.owner != nil && k.owner != kc {
		k.mu.Unlock()
		return errors.New("another server adopted the mounts first")
	}
	k.owner = kc
	mounts := make([]*keptMount, 0, len(k.mounts))
	for _, m := range k.mounts {
		mounts = append(mounts, m)
	}
	// Sending under mu keeps hold/drop of others out while fds go out.
	defer k.mu.Unlock()
	for _, m := range mounts {
		if err := kc.send(keeperMsg{Op: "mount", Key: m.key, Record: m.record}, m.fuseFD, m.stateFD); err != nil {
			return err
		}
	}
	var unserved time.Duration
	if !k.unservedSince.IsZero() && len(mounts) > 0 {
		unserved = time.Since(k.unservedSince)
	}
	k.unservedSince = time.Time{}
	k.log.Info("mounts adopted by a new server", "mounts", len(mounts), "unserved_for", unserved.Round(time.Millisecond))
	return kc.send(keeperMsg{Op: "end", UnservedNS: int64(unserved)})
}

// handoff sends every mount to a newer keeper, then stops listening and
// drops every connection: their servers reconnect to the new keeper.
func (k *Keeper) handoff(kc *keeperConn) {
	k.mu.Lock()
	// A release under way ends first: the new keeper must know whether an
	// owner is still serving (and will reconnect) or none is.
	if o := k.owner; o != nil && o.releaseAsked {
		k.mu.Unlock()
		select {
		case <-o.released:
		case <-time.After(releaseTimeout):
		}
		k.mu.Lock()
	}
	defer k.mu.Unlock()
	owned := k.owner != nil
	for _, m := range k.mounts {
		if err := kc.send(keeperMsg{Op: "mount", Key: m.key, Record: m.record, Owned: owned}, m.fuseFD, m.stateFD); err != nil {
			k.log.Error("handoff to a newer keeper failed; keeping the mounts", "err", err)
			return
		}
	}
	if err := kc.send(keeperMsg{Op: "end"}); err != nil {
		k.log.Error("handoff to a newer keeper failed; keeping the mounts", "err", err)
		return
	}
	k.log.Info("handed the mounts to a newer keeper", "mounts", len(k.mounts))
	k.handedOff = true
	if k.ln != nil {
		k.ln.Close()
	}
	for c := range k.conns {
		if c != kc {
			c.c.Close()
		}
	}
	for _, m := range k.mounts {
		m.close()
	}
	k.mounts = map[string]*keptMount{}
	k.owner = nil
}

// --- the serving process's side ----------------------------------------

// HeldMount is a mount given back by the keeper to an adopting server. The
// caller owns both files.
type HeldMount struct {
	Key    string
	Record []byte
	Fuse   *os.File // the mount's /dev/fuse
	State  *os.File // the state region
	// UnservedSince is when the mount's previous server stopped serving
	// it (by this process's clock); zero if no server did.
	UnservedSince time.Time
}

// Client is a serving process's connection to the keeper. It keeps a
// dup of each mount's fds, so that it can give them to a keeper that
// restarted (reconnecting by itself) or took over from another.
type Client struct {
	path      string
	log       *slog.Logger
	onRelease func()

	reqMu sync.Mutex // one request at a time
	mu    sync.Mutex // guards the fields below
	conn  seqConn
	up    bool
	// replies carries the answers to requests from the reader.
	replies chan keeperReply
	held    map[string]*clientMount
	// owner: this process adopted or held; it reattaches after a
	// reconnect. Cleared by a release.
	owner    bool
	released bool
	closed   bool
	connCh   chan struct{} // closed when a connection is up; replaced on loss
}

type keeperReply struct {
	m   keeperMsg
	fds []int
	err error
}

type clientMount struct {
	fuseFD, stateFD int
	record          []byte
}

// Dial connects to the keeper at path, retrying in the background
// until it answers (and again whenever the connection drops). onRelease is
// called when another server adopts the mounts: it must stop serving them
// (Session.Stop) and close their filesystems before returning.
func Dial(path string, log *slog.Logger, onRelease func()) *Client {
	if log == nil {
		log = slog.Default()
	}
	c := &Client{path: path, log: log, onRelease: onRelease, held: map[string]*clientMount{}, connCh: make(chan struct{})}
	go c.connectLoop()
	return c
}

// WaitConnected waits until the keeper answers or ctx ends.
func (c *Client) WaitConnected(ctx context.Context) error {
	c.mu.Lock()
	ch := c.connCh
	c.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("keeper at %s does not answer: %w", c.path, ctx.Err())
	}
}

func (c *Client) connectLoop() {
	backoff := 50 * time.Millisecond
	warned := time.Now()
	for {
		c.mu.Lock()
		if c.closed || c.released {
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		sc, err := dialSeq(c.path)
		if err != nil {
			if time.Since(warned) > 30*time.Second {
				c.log.Warn("keeper does not answer; mounts die with this process until it does", "socket", c.path, "err", err)
				warned = time.Now()
			}
			time.Sleep(backoff)
			backoff = min(backoff*2, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		replies := make(chan keeperReply, 1)
		c.mu.Lock()
		c.conn, c.up, c.replies = sc, true, replies
		c.mu.Unlock()
		readerDone := make(chan struct{})
		go c.readLoop(sc, replies, readerDone)
		if err := c.reattach(); err != nil {
			c.log.Warn("keeper: reattach failed", "err", err)
			sc.c.Close()
		} else {
			c.mu.Lock()
			close(c.connCh)
			c.mu.Unlock()
		}
		<-readerDone
		c.mu.Lock()
		c.up = false
		select {
		case <-c.connCh:
			c.connCh = make(chan struct{})
		default:
		}
		closed := c.closed || c.released
		c.mu.Unlock()
		if !closed {
			c.log.Warn("lost the keeper connection; reconnecting", "socket", c.path)
		}
	}
}

// reattach gives a (re)connected keeper what this process serves. It holds
// reqMu throughout, so that Hold and Drop wait and the fds stay open.
func (c *Client) reattach() error {
	c.reqMu.Lock()
	defer c.reqMu.Unlock()
	c.mu.Lock()
	owner := c.owner
	held := make(map[string]*clientMount, len(c.held))
	for k, v := range c.held {
		held[k] = v
	}
	c.mu.Unlock()
	if !owner {
		return nil
	}
	keys := make([]string, 0, len(held))
	for k := range held {
		keys = append(keys, k)
	}
	if _, err := c.requestLocked(keeperMsg{Op: "attach", Keys: keys}); err != nil {
		return err
	}
	for key, m := range held {
		if _, err := c.requestLocked(keeperMsg{Op: "hold", Key: key, Record: m.record}, m.fuseFD, m.stateFD); err != nil {
			return err
		}
	}
	return nil
}

// readLoop passes replies to the waiting request and handles "release".
func (c *Client) readLoop(sc seqConn, replies chan keeperReply, done chan struct{}) {
	defer close(done)
	defer close(replies)
	for {
		m, fds, err := sc.recv()
		if err != nil {
			return
		}
		if m.Op == "release" {
			go c.release(sc)
			continue
		}
		replies <- keeperReply{m: m, fds: fds}
	}
}

// release stops serving (onRelease) and tells the keeper.
func (c *Client) release(sc seqConn) {
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return
	}
	c.released = true
	c.mu.Unlock()
	c.log.Info("another server adopts the mounts: releasing them")
	if c.onRelease != nil {
		c.onRelease()
	}
	c.mu.Lock()
	for _, m := range c.held {
		unix.Close(m.fuseFD)
		unix.Close(m.stateFD)
	}
	c.held = map[string]*clientMount{}
	c.owner = false
	c.mu.Unlock()
	sc.send(keeperMsg{Op: "released"})
	sc.c.Close()
}

// Released tells whether another server took the mounts over.
func (c *Client) Released() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.released
}

// requestLocked sends one message and waits for its answer; the caller
// holds reqMu.
func (c *Client) requestLocked(m keeperMsg, fds ...int) (keeperReply, error) {
	c.mu.Lock()
	sc, up, replies := c.conn, c.up, c.replies
	c.mu.Unlock()
	if !up {
		return keeperReply{}, errors.New("not connected to the keeper")
	}
	if err := sc.send(m, fds...); err != nil {
		return keeperReply{}, err
	}
	r, ok := <-replies
	if !ok {
		return keeperReply{}, errors.New("keeper connection lost")
	}
	if r.m.Op == "error" {
		closeFDs(r.fds)
		return r, errors.New("keeper: " + r.m.Error)
	}
	return r, nil
}

// errKeeperLost: the connection dropped (a keeper restart or handoff).
var errKeeperLost = errors.New("keeper connection lost")

// Adopt makes this process the owner of every mount the keeper holds,
// after the previous owner released them, and returns them. A connection
// lost meanwhile (the keeper handing over to a newer one) is retried.
func (c *Client) Adopt(ctx context.Context) ([]HeldMount, error) {
	for {
		if err := c.WaitConnected(ctx); err != nil {
			return nil, err
		}
		got, err := c.adoptOnce(ctx)
		if !errors.Is(err, errKeeperLost) {
			return got, err
		}
		c.log.Info("keeper connection lost while adopting; retrying")
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("adopting from the keeper: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Client) adoptOnce(ctx context.Context) ([]HeldMount, error) {
	c.reqMu.Lock()
	defer c.reqMu.Unlock()
	c.mu.Lock()
	sc, up, replies := c.conn, c.up, c.replies
	c.mu.Unlock()
	if !up {
		return nil, errKeeperLost
	}
	if err := sc.send(keeperMsg{Op: "adopt"}); err != nil {
		return nil, fmt.Errorf("%w: %v", errKeeperLost, err)
	}
	var got []HeldMount
	fail := func(err error) ([]HeldMount, error) {
		for _, h := range got {
			h.Fuse.Close()
			h.State.Close()
		}
		return nil, err
	}
	for {
		var r keeperReply
		var ok bool
		select {
		case r, ok = <-replies:
		case <-ctx.Done():
			sc.c.Close()
			return fail(fmt.Errorf("adopting from the keeper: %w", ctx.Err()))
		}
		if !ok {
			return fail(errKeeperLost)
		}
		switch r.m.Op {
		case "mount":
			if len(r.fds) != 2 {
				closeFDs(r.fds)
				return fail(fmt.Errorf("keeper sent mount %q with %d fds", r.m.Key, len(r.fds)))
			}
			got = append(got, HeldMount{Key: r.m.Key, Record: r.m.Record,
				Fuse: os.NewFile(uintptr(r.fds[0]), "fuse"), State: os.NewFile(uintptr(r.fds[1]), "state")})
		case "end":
			if r.m.UnservedNS > 0 {
				since := time.Now().Add(-time.Duration(r.m.UnservedNS))
				for i := range got {
					got[i].UnservedSince = since
				}
			}
			c.mu.Lock()
			c.owner = true
			for _, h := range got {
				if cm, err := dupMount(int(h.Fuse.Fd()), int(h.State.Fd()), h.Record); err == nil {
					c.held[h.Key] = cm
				}
			}
			c.mu.Unlock()
			return got, nil
		case "error":
			closeFDs(r.fds)
			return fail(errors.New("keeper: " + r.m.Error))
		default:
			closeFDs(r.fds)
		}
	}
}

// dupMount keeps copies of a mount's fds for a later reattach. (Never wrap
// a borrowed fd in os.NewFile: its finalizer would close it.)
func dupMount(fuseFD, stateFD int, record []byte) (*clientMount, error) {
	f, err := unix.FcntlInt(uintptr(fuseFD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	s, err := unix.FcntlInt(uintptr(stateFD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Close(f)
		return nil, err
	}
	return &clientMount{fuseFD: f, stateFD: s, record: append([]byte(nil), record...)}, nil
}

// Hold gives the keeper a mount this process serves (replacing an earlier
// one under the same key). If the keeper is not reachable now, the mount is
// remembered and given when it is, and Hold returns the error.
func (c *Client) Hold(key string, fuseFD int, state *os.File, record []byte) error {
	cm, err := dupMount(fuseFD, int(state.Fd()), record)
	if err != nil {
		return fmt.Errorf("keeper: dup fds: %w", err)
	}
	c.reqMu.Lock()
	defer c.reqMu.Unlock()
	c.mu.Lock()
	if old := c.held[key]; old != nil {
		unix.Close(old.fuseFD)
		unix.Close(old.stateFD)
	}
	c.held[key] = cm
	c.owner = true
	c.mu.Unlock()
	_, err = c.requestLocked(keeperMsg{Op: "hold", Key: key, Record: cm.record}, cm.fuseFD, cm.stateFD)
	return err
}

// Drop tells the keeper a mount is gone.
func (c *Client) Drop(key string) error {
	c.reqMu.Lock()
	defer c.reqMu.Unlock()
	c.mu.Lock()
	if old := c.held[key]; old != nil {
		unix.Close(old.fuseFD)
		unix.Close(old.stateFD)
		delete(c.held, key)
	}
	c.mu.Unlock()
	_, err := c.requestLocked(keeperMsg{Op: "drop", Key: key})
	return err
}

// Close disconnects; the keeper keeps what it holds.
func (c *Client) Close() {
	c.mu.Lock()
	c.closed = true
	if c.up {
		c.conn.c.Close()
	}
	for _, m := range c.held {
		unix.Close(m.fuseFD)
		unix.Close(m.stateFD)
	}
	c.held = map[string]*clientMount{}
	c.mu.Unlock()
}
