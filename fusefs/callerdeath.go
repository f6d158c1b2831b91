package fusefs

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"sync"
	"time"
)

// Requests whose caller is killed.
//
// The kernel removes a request that a SIGKILLed caller waits for only while
// no server has read it; once read, the caller stays in the kernel until
// the answer comes (fs/fuse/dev.c, request_wait_answer). A readdir or read
// waiting for a saturated store kept a killed `ls` for more than 75 s.
//
// The kernel sends FUSE_INTERRUPT for a request whose caller got a signal,
// any signal: the Go runtime's SIGURG, a shell's SIGCHLD, and the first
// one only. Most are not the end of the caller, and a request abandoned on
// them would answer EINTR to a caller that goes on (see reqContext). So an
// interrupt only starts a watch on the caller: a read-only request
// (lookup, getattr, readdir, read, readlink) ends, answering EINTR, once
// its calling thread has SIGKILL pending or is gone, checked every
// callerPoll; any other request runs to its end, as before (a change may
// reach the store whatever its caller does). The interrupt itself gets no
// answer, which the protocol allows.
//
// The caller is the thread id the kernel puts in the request, in the pid
// namespace of the process that mounted; 0 (a caller outside it) cannot be
// watched, and is not.

// callerPoll is how often an interrupted read checks its caller.
const callerPoll = 20 * time.Millisecond

// readRequests are the read-only requests in flight that a dead caller may
// end, and the interrupts that came before their request was registered.
type readRequests struct {
	mu       sync.Mutex
	inFlight map[uint64]*readRequest
	// early: interrupts for requests not (yet) registered, by unique,
	// with when they came; dropped after earlyFor.
	early map[uint64]time.Time
}

// earlyFor is how long an interrupt waits for its request to register: the
// request and its interrupt can be read by two readers in either order.
const earlyFor = 10 * time.Second

// earlyPrune and earlyMax bound the early interrupts kept: past earlyPrune
// the stale ones go, past earlyMax all (a request registered after its
// interrupt is then answered when it ends, as before).
const (
	earlyPrune = 256
	earlyMax   = 4096
)

type readRequest struct {
	pid      uint32
	ctx      context.Context // ends with the request
	cancel   context.CancelFunc
	watching bool
}

// readContext is reqContext for a read-only request: its context also
// ends when the caller dies after an interrupt. done unregisters it.
func (fs *FS) readContext(unique uint64, pid uint32) (ctx context.Context, done func()) {
	ctx, cancel := context.WithCancel(fs.ctx)
	if pid == 0 {
		return ctx, cancel
	}
	r := &fs.reads
	req := &readRequest{pid: pid, ctx: ctx, cancel: cancel}
	r.mu.Lock()
	if r.inFlight == nil {
		r.inFlight = map[uint64]*readRequest{}
	}
	r.inFlight[unique] = req
	if _, ok := r.early[unique]; ok {
		delete(r.early, unique)
		req.watching = true
		go fs.watchCaller(req)
	}
	r.mu.Unlock()
	return ctx, func() {
		r.mu.Lock()
		delete(r.inFlight, unique)
		r.mu.Unlock()
		cancel()
	}
}

// callerGone tells whether a read-only request's context ended because its
// caller was killed (or the file system is closing): no failure of blobfs
// to report.
func callerGone(ctx context.Context) bool { return ctx.Err() != nil }

// Interrupt is the session's FUSE_INTERRUPT for the request unique.
func (fs *FS) Interrupt(unique uint64) {
	r := &fs.reads
	r.mu.Lock()
	defer r.mu.Unlock()
	if req, ok := r.inFlight[unique]; ok {
		if !req.watching {
			req.watching = true
			go fs.watchCaller(req)
		}
		return
	}
	// A change (never ended early), a request already answered, or one
	// not registered yet: remember it for the last.
	now := time.Now()
	if r.early == nil {
		r.early = map[uint64]time.Time{}
	}
	if len(r.early) >= earlyPrune {
		// A Go caller's SIGURGs interrupt its changes many times a
		// second: old entries go in one pass now and then, not a pass
		// per interrupt.
		for u, at := range r.early {
			if now.Sub(at) > earlyFor {
				delete(r.early, u)
			}
		}
		if len(r.early) >= earlyMax {
			clear(r.early)
		}
	}
	r.early[unique] = now
}

// watchCaller ends req once its caller is dying; it stops when req ends.
func (fs *FS) watchCaller(req *readRequest) {
	t := time.NewTicker(callerPoll)
	defer t.Stop()
	for {
		if callerDying(req.pid) {
			fs.log.Debug("the caller of a read was killed; answering it now", "pid", req.pid)
			req.cancel()
			return
		}
		select {
		case <-req.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// callerDying tells whether thread tid has SIGKILL pending (the kernel
// marks every thread of a process being killed), is exiting, or is gone.
func callerDying(tid uint32) bool {
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(tid), 10) + "/status")
	if err != nil {
		return os.IsNotExist(err)
	}
	for line := range bytes.Lines(b) {
		switch {
		case bytes.HasPrefix(line, []byte("State:")):
			if f := bytes.Fields(line[6:]); len(f) > 0 && (f[0][0] == 'Z' || f[0][0] == 'X') {
				return true
			}
		case bytes.HasPrefix(line, []byte("SigPnd:")), bytes.HasPrefix(line, []byte("ShdPnd:")):
			mask, err := strconv.ParseUint(string(bytes.TrimSpace(line[7:])), 16, 64)
			if err == nil && mask&(1<<(9-1)) != 0 { // SIGKILL is signal 9
				return true
			}
		}
	}
	return false
}
