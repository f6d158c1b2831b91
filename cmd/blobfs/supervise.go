package main

// Background mounts: a supervisor and a worker.
//
// `blobfs mount` without --foreground detaches a supervisor. The supervisor
// makes the mount (kernel.MountFD) and a state region (fusefs.NewState) and
// holds both for the mount's whole life; a worker process, this same binary
// in the hidden mode `mount-worker`, serves the mount from them. While the
// supervisor holds the /dev/fuse descriptor, the kernel keeps the mount
// alive when the worker dies: requests wait in the kernel's queue. The
// supervisor then starts a new worker, which rebuilds its tables from the
// state region, adopts the live mount (kernel.Serve) and answers what
// waited, including, with FUSE_NOTIFY_RESEND, the requests the dead worker
// had taken. The supervisor never opens a file on the mount and never
// touches the store after its pre-mount check: little in it can crash, and
// it never waits on its own mount.
//
// Restarts back off: the first two crashes in a row restart at once, then
// the wait doubles from 250ms up to 30s. A worker that served for
// healthyUptime was healthy, and the count starts again. At the
// --restart-limit-th crash in a row (N: N-1 restarts; 0 counts as 1) the
// supervisor stops restarting and says so in the log; the mount stays held, so applications wait instead of
// failing, until SIGHUP (try again), SIGTERM (a last worker uploads and
// unmounts) or an unmount from outside.
//
// Ends: an unmount from outside ends the worker's session; it uploads dirty
// files and exits 0, and the supervisor follows. SIGTERM or SIGINT to the
// supervisor is forwarded to the worker, which uploads and unmounts (lazily
// after --shutdown-grace if files are still open). If no worker is running
// at that moment, the supervisor starts one for the purpose: the dirty
// files of open handles are known only through the state region, and only a
// worker uploads them.

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/fusefs"
	"github.com/blobfs/blobfs/fusefs/kernel"
)

// The worker's inherited descriptors.
const (
	workerFuseFD  = 3 // the mount's /dev/fuse
	workerStateFD = 4 // the state region (memfd)
	workerReadyFD = 5 // "ok DESC" or "error MSG", then closed
)

// workerMode is the hidden subcommand a supervisor runs its worker with.
const workerMode = "mount-worker"

// unservedEnv tells a restarted worker when the one before it died (Unix
// nanoseconds): the restart's pause, in its log and metrics.
const unservedEnv = "BLOBFS_UNSERVED_SINCE"

const (
	// healthyUptime: a worker that served this long before dying was not
	// part of a crash loop.
	healthyUptime = 10 * time.Second
	// finishAttempts bounds the workers started to upload and unmount
	// after SIGTERM or an unmount, when each of them dies too.
	finishAttempts = 3
)

// restartDelay is the wait before restarting after crashes crashes in a
// row (1 is the first): none for the first two, so that a single crash
// costs applications only a worker's start-up, then doubling from 250ms up
// to 30s.
func restartDelay(crashes int) time.Duration {
	if crashes <= 2 {
		return 0
	}
	if crashes > 10 {
		return 30 * time.Second
	}
	return min(250*time.Millisecond<<(crashes-3), 30*time.Second)
}

// supervisor holds a background mount and runs its worker.
type supervisor struct {
	mp  string
	log *slog.Logger
	// exe is the binary's path when the supervisor started: a restarted
	// worker runs whatever binary is at that path now.
	exe        string
	workerArgs []string
	// logs is the log file, shared with the workers: it also receives a
	// worker's stdout and stderr (a panic's trace lands in the log file).
	// SIGHUP reopens it; run, the only goroutine that starts workers and
	// handles signals, hands each new worker the file of the moment.
	logs  *logFile
	fuse  *os.File // the mount's /dev/fuse descriptor, held for its life
	state *os.File // the state region, held for the mount's life
	limit int      // the crash in a row at which it gives up (0 as 1)
}

// worker is one running worker process.
type worker struct {
	cmd     *exec.Cmd // nil if it could not be started
	pid     int
	started time.Time
	// ready delivers one message: the worker serves, or why it could not.
	// exited delivers cmd.Wait's result, always after ready's message.
	ready    chan workerReady
	exited   chan error
	answered bool // ready's message was received
	serving  bool
	termSent bool
	hupOwed  bool // SIGHUP came before it served: passed on once it does
}

type workerReady struct {
	desc string
	err  error
}

// supervise is the detached child of `blobfs mount`: it checks the store,
// mounts, and keeps a worker serving the mount until it is unmounted or
// told to stop. ready tells the waiting `blobfs mount` the outcome.
func supervise(c *mountConfig, mp string, args []string, ready func(error, string)) (err error) {
	defer func() { ready(err, "") }()
	logFlags := c.log
	if logFlags.file == "" {
		logFlags.file = backgroundLogFile(mp)
	}
	logger, logs, err := newLogger(logFlags, os.Stderr)
	if err != nil {
		return err
	}
	defer logs.Close()
	logger = logger.With("process", "supervisor")
	if c.limit < 0 {
		return usageError{errors.New("--restart-limit must not be negative")}
	}

	// Check what can be checked before anything is mounted, so that a
	// wrong key or a missing directory leaves nothing behind.
	if _, err := c.fsOptions(logger); err != nil {
		return err
	}
	ctx, cancel := signalContext(logger, "the store check stops; nothing is mounted")
	_, _, err = c.openStore(ctx, logger, nil)
	cancel()
	if err != nil {
		return err
	}
	// Every worker must use the same cache directory: the spill files of
	// open files, named in the state region, live there.
	cacheDir, madeCacheDir := c.FS.CacheDir, false
	if cacheDir == "" {
		if cacheDir, err = makeCacheDir(); err != nil {
			return err
		}
		madeCacheDir = true
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}

	state, err := fusefs.NewState()
	if err != nil {
		return err
	}
	defer state.Close()
	mo := c.Mount
	mo.ReadOnly = c.FS.ReadOnly
	mo.FsName = c.fsName()
	mo.Logger = logger
	_, fd, err := kernel.MountFD(mp, mo)
	if err != nil {
		return err
	}
	fuse := os.NewFile(uintptr(fd), "fuse")
	defer fuse.Close()

	var defaults []string
	if madeCacheDir {
		defaults = append(defaults, "--cache-dir="+cacheDir)
	}
	if c.log.file == "" {
		defaults = append(defaults, "--log-file="+logFlags.file)
	}
	s := &supervisor{
		mp:         mp,
		log:        logger,
		exe:        exe,
		workerArgs: append(defaults, args...),
		logs:       logs,
		fuse:       fuse,
		state:      state,
		limit:      c.limit,
	}
	err = s.run(ready)
	if madeCacheDir {
		removeMadeCacheDir(cacheDir, logger)
	}
	return err
}

// run starts the first worker, reports the mount ready once it serves, and
// then restarts workers that die, until one exits having finished (the
// mount unmounted) or the supervisor gives up for good.
func (s *supervisor) run(ready func(error, string)) error {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	gone := watchConnection(int(s.fuse.Fd()), s.log)

	l := &superviseLoop{s: s, first: true, ready: ready}
	l.w = s.start(time.Time{})
	for {
		var readyCh <-chan workerReady
		var exitCh <-chan error
		if l.w != nil {
			exitCh = l.w.exited
			if !l.w.answered {
				readyCh = l.w.ready
			}
		}
		var timer <-chan time.Time
		if l.wait != nil {
			timer = l.wait.C
		}
		select {
		case r := <-readyCh:
			l.workerReady(r)
		case err := <-exitCh:
			if done, err := l.workerExited(err); done {
				return err
			}
		case <-timer:
			l.wait = nil
			l.startNow()
		case <-gone:
			gone = nil
			l.unmount = true
			if l.w == nil {
				s.log.Info("the mount was unmounted while no worker ran: starting one to upload what is left")
				l.startNow()
			}
		case sig := <-sigs:
			l.signal(sig)
		}
	}
}

// superviseLoop is the supervisor's state between two events of run.
type superviseLoop struct {
	s        *supervisor
	ready    func(error, string) // called once, when the first worker serves
	w        *worker             // the running worker, nil while none runs
	first    bool                // the first worker has not served yet
	crashes  int                 // abnormal worker exits in a row
	stopping bool                // SIGTERM or SIGINT received
	unmount  bool                // the mount is gone: the kernel ended the connection
	// finishers counts the workers that died after stopping or unmount.
	finishers int
	gaveUp    bool
	wait      *time.Timer // the back-off before the next start, nil if none
	down      time.Time   // when the last worker died
	readyErr  error       // why the last worker could not serve
}

// startNow starts a worker at once, ending any back-off, unless one runs.
func (l *superviseLoop) startNow() {
	if l.wait != nil {
		l.wait.Stop()
		l.wait = nil
	}
	if l.w == nil {
		l.w = l.s.start(l.down)
	}
}

// workerReady: the running worker serves the mount, or says why it cannot.
func (l *superviseLoop) workerReady(r workerReady) {
	s, w := l.s, l.w
	w.answered = true
	if r.err != nil {
		// Its exit follows.
		s.log.Error("worker could not serve", "pid", w.pid, "err", r.err)
		l.readyErr = r.err
		return
	}
	w.serving = true
	if l.first {
		l.first = false
		s.log.Info("worker serves the mount", "pid", w.pid, "mountpoint", s.mp)
		l.ready(nil, r.desc)
	} else {
		s.log.Info("worker restarted; it adopted the mount", "pid", w.pid,
			"mount_unserved_for", time.Since(l.down).Round(time.Millisecond))
	}
	if l.stopping && !w.termSent {
		s.terminate(w)
	}
	if w.hupOwed {
		w.hupOwed = false
		s.hangUp(w)
	}
}

// workerExited: the running worker exited with err (nil: it finished). It
// returns done when the supervisor ends, with run's result.
func (l *superviseLoop) workerExited(err error) (done bool, result error) {
	s, w := l.s, l.w
	pid, uptime := w.pid, time.Since(w.started)
	if !w.answered {
		// The ready message was sent before the exit.
		if r := <-w.ready; r.err != nil {
			l.readyErr = r.err
		}
	}
	l.w, l.down = nil, time.Now()
	if l.first {
		// Never served: the mount is useless; say why.
		kernel.Unmount(s.mp, true)
		if l.readyErr != nil {
			return true, l.readyErr
		}
		return true, fmt.Errorf("background worker exited before serving: %s", exitText(err))
	}
	if err == nil {
		s.log.Info("worker finished; the mount is unmounted", "pid", pid)
		return true, nil
	}
	s.log.Error("worker died", "pid", pid, "exit", exitText(err), "uptime", uptime.Round(time.Millisecond))
	if l.stopping || l.unmount {
		// Finishing: what the dead worker left unuploaded is reachable
		// only through a worker (the state region).
		l.finishers++
		if l.finishers >= finishAttempts {
			return true, s.abandon(fmt.Sprintf("%d workers died while uploading dirty files before the end", l.finishers))
		}
		s.log.Warn("starting a worker to upload dirty files and finish", "stopping", l.stopping, "unmounted", l.unmount)
		l.startNow()
		return false, nil
	}
	if uptime >= healthyUptime {
		l.crashes = 0
	}
	l.crashes++
	if l.crashes >= s.limit {
		l.gaveUp = true
		s.log.Error("not restarting the worker: it died "+fmt.Sprint(l.crashes)+" times in a row (--restart-limit "+fmt.Sprint(s.limit)+"). "+
			"The mount stays and requests to it wait: send SIGHUP to the supervisor to try again, "+
			"SIGTERM to upload dirty files and unmount, or detach it with: blobfs unmount -z "+s.mp,
			"supervisor_pid", os.Getpid())
		return false, nil
	}
	d := restartDelay(l.crashes)
	s.log.Warn("restarting the worker", "crashes_in_a_row", l.crashes, "after", d)
	if d == 0 {
		l.startNow()
	} else {
		l.wait = time.NewTimer(d)
	}
	return false, nil
}

// signal: SIGHUP reopens the logs (and starts a worker at once if none
// runs); SIGTERM and SIGINT have the worker upload dirty files and
// unmount.
func (l *superviseLoop) signal(sig os.Signal) {
	s, w := l.s, l.w
	switch {
	case sig == syscall.SIGHUP:
		// logrotate's signal: reopen the log file here and in the
		// worker. And, as before, try again at once if no worker runs
		// (after giving up, or during a back-off).
		reopenLog(s.log, s.logs, sig)
		if w == nil {
			s.log.Info("SIGHUP: starting a worker now", "was_given_up", l.gaveUp)
			l.crashes, l.gaveUp = 0, false
			l.startNow()
		} else if w.serving {
			s.hangUp(w)
		} else {
			w.hupOwed = true
		}
	case l.stopping:
		s.log.Info("signal received again: already stopping", "signal", sig.String())
	default:
		l.stopping = true
		s.log.Info("signal received: the worker uploads dirty files and unmounts, then both exit", "signal", sig.String())
		if w == nil {
			// The dirty files of the dead worker are in the state
			// region: a worker must upload them.
			l.startNow()
		} else if w.serving {
			s.terminate(w)
		} // else: sent when it serves
	}
}

// start starts a worker on the held mount; down is when the one before it
// died (zero for the first). A worker that cannot even be started is
// reported like one that died at once.
func (s *supervisor) start(down time.Time) *worker {
	w := &worker{started: time.Now(), ready: make(chan workerReady, 1), exited: make(chan error, 1)}
	fail := func(err error) *worker {
		w.ready <- workerReady{err: err}
		w.exited <- err
		return w
	}
	r, pw, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	cmd := exec.Command(s.exe, append([]string{workerMode}, s.workerArgs...)...)
	if !down.IsZero() {
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", unservedEnv, down.UnixNano()))
	}
	cmd.ExtraFiles = []*os.File{s.fuse, s.state, pw}
	out := s.logs.File()
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Start()
	pw.Close()
	if err != nil {
		r.Close()
		return fail(fmt.Errorf("start worker: %w", err))
	}
	w.cmd, w.pid = cmd, cmd.Process.Pid
	s.log.Debug("worker started", "pid", w.pid)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer r.Close()
		// The worker holds the only write end: a dead worker means EOF.
		line, _ := bufio.NewReader(r).ReadString('\n')
		status, msg, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch status {
		case "ok":
			w.ready <- workerReady{desc: msg}
		case "error":
			w.ready <- workerReady{err: errors.New(msg)}
		default:
			w.ready <- workerReady{err: errors.New("worker exited before serving")}
		}
	}()
	go func() {
		err := cmd.Wait()
		<-readDone
		w.exited <- err
	}()
	return w
}

// terminate asks a serving worker to upload and unmount.
func (s *supervisor) terminate(w *worker) {
	w.termSent = true
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		s.log.Warn("could not signal the worker; its exit will restart it", "err", err)
	}
}

// hangUp passes a SIGHUP on to a serving worker: it reopens its log file.
// A worker that is not serving yet may not have set up its handler, and
// SIGHUP would kill it.
func (s *supervisor) hangUp(w *worker) {
	if err := w.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		s.log.Warn("could not pass SIGHUP on to the worker", "pid", w.pid, "err", err)
	}
}

// abandon ends the supervisor when no worker can finish the mount: it
// detaches the mount (so that nothing hangs on it) and says what is lost.
func (s *supervisor) abandon(why string) error {
	err := kernel.Unmount(s.mp, true)
	if err != nil && !errors.Is(err, syscall.EINVAL) { // EINVAL: not mounted any more
		s.log.Warn("lazy unmount", "err", err)
	}
	s.log.Error("giving up: "+why+"; files that were open for writing and not yet uploaded were not uploaded (their spill files stay in the cache directory)",
		"mountpoint", s.mp)
	return errors.New(why)
}

// watchConnection closes the returned channel when the kernel ends the FUSE
// connection (the mount was unmounted, or aborted). poll(2) with no events
// asked reports only POLLERR, which /dev/fuse raises once the connection is
// gone; it reads nothing, so it never takes a request from the worker.
func watchConnection(fd int, log *slog.Logger) <-chan struct{} {
	gone := make(chan struct{})
	go func() {
		for {
			pfd := []unix.PollFd{{Fd: int32(fd)}}
			_, err := unix.Poll(pfd, -1)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				log.Warn("cannot watch the FUSE connection; an unmount is noticed when the worker exits", "err", err)
				return
			}
			if pfd[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
				close(gone)
				return
			}
		}
	}()
	return gone
}

// exitText says how a process ended: "exit status 1", "signal: killed".
func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// runMountWorker is `blobfs mount-worker`: it serves the mount its
// supervisor holds (fds 3 and 4), adopting it if a previous worker served
// it, and reports on fd 5 once it serves.
func runMountWorker(c *mountConfig, fl *pflag.FlagSet, args []string) error {
	var st unix.Stat_t
	if err := unix.Fstat(workerFuseFD, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != unix.Mkdev(10, 229) {
		return usageError{errors.New(workerMode + " is run by a background `blobfs mount`, with the mount's /dev/fuse as fd 3; not by hand")}
	}
	if len(args) != 1 {
		return usageError{errors.New(workerMode + " needs exactly one MOUNTPOINT")}
	}
	// The supervisor checked the flags; this also derives what they
	// imply (which ones were given).
	if err := c.checkFlags(fl); err != nil {
		return usageError{err}
	}
	mp, err := filepath.Abs(args[0])
	if err != nil {
		return err
	}
	c.create = false // the supervisor did
	logger, logs, err := newLogger(c.log, os.Stderr)
	if err != nil {
		return err
	}
	if logs != nil {
		defer logs.Close()
	}
	logger = logger.With("process", "worker", "pid", os.Getpid())
	defer reopenOnSIGHUP(logger, logs)()
	ready := readyReporter(os.NewFile(workerReadyFD, "ready"))
	kept := &keptMount{fuseFD: workerFuseFD, state: os.NewFile(workerStateFD, "state")}
	if ns, err := strconv.ParseInt(os.Getenv(unservedEnv), 10, 64); err == nil {
		kept.unservedSince = time.Unix(0, ns)
	}
	os.Unsetenv(unservedEnv)
	err = serve(c, mp, logger, ready, kept)
	if err != nil {
		// Logged here, not printed: the worker's stderr is the log
		// file too, and a bare line there would not parse as a log.
		logger.Error("worker exits", "err", err)
		return errLogged{err}
	}
	return nil
}
