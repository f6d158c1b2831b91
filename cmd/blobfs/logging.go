package main

// Logging: the --log-level, --log-format and --log-file flags, and the
// signals of long-running commands.
//
// Every line goes through blobstore's redaction (no secret in a log) and
// every key is snake_case ASCII, so that a logfmt parser reads the text
// format and the JSON format has keys alike (logkeys_test.go checks the
// sources, logformat_test.go the lines real commands write).
//
// A --log-file is opened again at its path on SIGHUP, as logrotate
// expects: it renames the file away and signals the process, which then
// writes to a new file at the path. Without --log-file nothing is reopened
// and SIGHUP keeps the meaning it has for that process.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
)

// logFlags are the logging flags of a command. file is set only by
// commands that have --log-file (the mounts); the others log to stderr,
// which their container runtime collects.
type logFlags struct {
	level  string
	format string
	file   string
}

// register declares --log-level and --log-format; keep the tables in
// docs/reference.md in step (docs_test.go checks).
func (l *logFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&l.level, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&l.format, "log-format", "text", "text (logfmt: key=value pairs) or json (one object a line)")
}

// check refuses a level or a format that does not exist, in the flag's
// name.
func (l logFlags) check() error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return fmt.Errorf("--log-level %q: use debug, info, warn or error", l.level)
	}
	if l.format != "text" && l.format != "json" {
		return fmt.Errorf("--log-format %q: use text or json", l.format)
	}
	return nil
}

// newLogger builds the logger the flags ask for. It writes to l.file if
// one is given (returned, to be reopened on SIGHUP and closed at the end),
// else to fallback.
func newLogger(l logFlags, fallback io.Writer) (*slog.Logger, *logFile, error) {
	if err := l.check(); err != nil {
		return nil, nil, usageError{err}
	}
	var level slog.Level
	level.UnmarshalText([]byte(l.level))
	w, file := fallback, (*logFile)(nil)
	if l.file != "" {
		var err error
		if file, err = openLogFile(l.file); err != nil {
			return nil, nil, err
		}
		w = file
	}
	var h slog.Handler
	if l.format == "json" {
		// Durations as the text format writes them ("1.5s"), not in
		// nanoseconds: a key says no unit.
		h = slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.StringValue(a.Value.Duration().String())
			}
			return a
		}})
	} else {
		h = slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})
	}
	// Every line passes through blobstore's redaction: no secret in a log.
	return slog.New(blobstore.NewRedactingHandler(h)), file, nil
}

// logFile is a log file that can be opened again at its path (Reopen),
// after logrotate has renamed it away. A process whose stderr was the same
// file when it was opened (a background worker: its supervisor points the
// worker's stdout and stderr at the log, for panic traces) has them moved
// to the new file too.
type logFile struct {
	path string
	// stdio: the descriptors (1, 2) that were this file at open.
	stdio []int

	mu sync.Mutex // guards f; held for a whole Write, so a line goes to one file
	f  *os.File
}

func openLogFile(path string) (*logFile, error) {
	f, err := openLogPath(path)
	if err != nil {
		return nil, err
	}
	l := &logFile{path: path, f: f}
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) == nil {
		for _, fd := range []int{1, 2} {
			var o unix.Stat_t
			if unix.Fstat(fd, &o) == nil && o.Dev == st.Dev && o.Ino == st.Ino {
				l.stdio = append(l.stdio, fd)
			}
		}
	}
	return l, nil
}

func openLogPath(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("log file: %w", err)
	}
	return f, nil
}

func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Write(p)
}

// File returns the file written now; it stays open until the next Reopen
// or Close.
func (l *logFile) File() *os.File {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f
}

// Reopen opens the path again and writes there from now on. If the path
// cannot be opened, the old file is kept (a log in a renamed file beats no
// log) and the error returned.
func (l *logFile) Reopen() error {
	f, err := openLogPath(l.path)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, fd := range l.stdio {
		// Best effort: on failure the trace of a panic goes to the
		// renamed file, as it did before.
		unix.Dup2(int(f.Fd()), fd)
	}
	old := l.f
	l.f = f
	return old.Close()
}

func (l *logFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}

// reopenOnSIGHUP reopens file at every SIGHUP until the returned function
// is called, and logs each reopening. With file nil it does nothing: SIGHUP
// keeps its default action (the process ends), as before --log-file could
// be reopened.
func reopenOnSIGHUP(logger *slog.Logger, file *logFile) (stop func()) {
	if file == nil {
		return func() {}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case sig := <-sigs:
				reopenLog(logger, file, sig)
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(sigs); close(done) }
}

// reopenLog reopens file on sig and logs it, in the new file.
func reopenLog(logger *slog.Logger, file *logFile, sig os.Signal) {
	if err := file.Reopen(); err != nil {
		logger.Error("cannot reopen the log file; still writing to the old one", "signal", sig.String(), "path", file.path, "err", err)
		return
	}
	logger.Info("log file reopened", "signal", sig.String(), "path", file.path)
}

// signalContext is a context that ends at SIGINT or SIGTERM. It logs the
// signal with what the process does about it (then), so that an operator
// reading the log sees why it stopped, and logs any later one as ignored.
func signalContext(logger *slog.Logger, then string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case sig := <-sigs:
				if ctx.Err() == nil {
					logger.Info("signal received: "+then, "signal", sig.String())
					cancel()
				} else {
					logger.Info("signal received again: already stopping", "signal", sig.String())
				}
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			signal.Stop(sigs)
			close(done)
			cancel()
		})
	}
}

// errLogged is an error that the command has already logged (to its log
// file): main exits 1 without printing it again, for a process whose
// stderr is that log file too.
type errLogged struct{ error }

func (e errLogged) Unwrap() error { return e.error }
