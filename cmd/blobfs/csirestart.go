package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// Restarting the driver in place (--restart-in-place).
//
// When the driver's process dies, kubelet restarts its container, but
// with a back-off that doubles from 10 s up to 5 minutes and is reset only
// after 10 minutes of running: measured on the real kubelet (make e2e),
// applications on the node's volumes paused 0.5-1.5 s on a first crash,
// then 18-19 s on the second, 28-33 s on the third. Their requests wait in
// the kernel all that time (the keeper holds the mounts).
//
// With --restart-in-place the container's main process only supervises:
// it runs the driver as its child and starts it again at once when it
// dies from a signal (a crash, an OOM kill of the child, which the kernel
// picks as the larger process) or fails after having served for a while.
// A driver that fails within its first seconds (a bad flag, a missing
// directory) is not retried here: the supervisor exits with its status, so
// that kubelet shows the failure. Nor is one that keeps dying: after
// inPlaceLimit restarts within inPlaceWindow the supervisor gives up and
// exits, and kubelet's restart (and its back-off, and its restart count)
// takes over. The child dies with the supervisor (PR_SET_PDEATHSIG), so a
// kill of the container's main process is a container restart as before.
// SIGTERM, SIGINT and SIGHUP are passed on to the child.
const (
	inPlaceLimit  = 5
	inPlaceWindow = 10 * time.Minute
	// A child that served this long before it failed is restarted.
	inPlaceMinUptime = 10 * time.Second
)

// Environment of the child: that it is one, and what came before it (for
// blobfs_csi_driver_restarts_total).
const (
	envCSIChild    = "BLOBFS_CSI_CHILD"
	envCSIRestarts = "BLOBFS_CSI_RESTARTS"
)

// superviseCSI runs the driver (this binary, the same arguments) as a child
// and restarts it in place; it returns the error that ends the container.
func superviseCSI(logger *slog.Logger) error {
	// PR_SET_PDEATHSIG fires when the thread that started the child
	// ends: keep this goroutine on one thread that never ends.
	runtime.LockOSThread()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var restarts []time.Time
	for {
		cmd := exec.Command(exe, os.Args[1:]...)
		cmd.Env = append(os.Environ(), envCSIChild+"=1", envCSIRestarts+"="+strconv.Itoa(len(restarts)))
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		started := time.Now()
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start the driver: %w", err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		stopping := false
		var exitErr error
	wait:
		for {
			select {
			case s := <-sigs:
				if s != syscall.SIGHUP {
					stopping = true
				}
				cmd.Process.Signal(s)
			case exitErr = <-done:
				break wait
			}
		}
		if stopping || exitErr == nil {
			return exitStatus(exitErr)
		}
		uptime := time.Since(started)
		signalled := false
		var ee *exec.ExitError
		if errors.As(exitErr, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				signalled = true
			}
		}
		if !signalled && uptime < inPlaceMinUptime {
			logger.Error("the driver failed at start; not restarting it in place (kubelet restarts the container)", "err", exitErr, "uptime", uptime.Round(time.Millisecond))
			return exitStatus(exitErr)
		}
		now := time.Now()
		recent := restarts[:0:0]
		for _, t := range restarts {
			if now.Sub(t) < inPlaceWindow {
				recent = append(recent, t)
			}
		}
		if len(recent) >= inPlaceLimit {
			logger.Error("the driver keeps dying; no more restarts in place (kubelet restarts the container, with its back-off)",
				"err", exitErr, "restarts_in_place", len(recent), "within", inPlaceWindow)
			return exitStatus(exitErr)
		}
		restarts = append(restarts, now)
		logger.Warn("the driver died; starting it again in place (the keeper holds the mounts meanwhile)",
			"err", exitErr, "uptime", uptime.Round(time.Millisecond), "restarts_in_place", len(restarts))
	}
}

// childExit is a child's end as this process's own: its exit code, or 128
// plus the signal that killed it, as a shell reports it.
type childExit struct{ code int }

func (e childExit) Error() string { return "the driver exited with status " + strconv.Itoa(e.code) }

func exitStatus(err error) error {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return err
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return childExit{128 + int(ws.Signal())}
	}
	return childExit{ee.ExitCode()}
}

// restartsBefore is how many times the supervisor restarted the driver
// before this process (0 when it is not a supervised child).
func restartsBefore() int {
	n, _ := strconv.Atoi(os.Getenv(envCSIRestarts))
	return n
}
