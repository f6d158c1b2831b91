package storetest

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
)

// LogBuffer is a bytes.Buffer safe for a logger writing it while a test
// reads it.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *LogBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *LogBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// CapturingLogger logs everything, at debug level, to the returned buffer
// (and to stderr under -v), for tests that check what was logged.
func CapturingLogger(t testing.TB) (*slog.Logger, *LogBuffer) {
	lb := &LogBuffer{}
	var w io.Writer = lb
	if testing.Verbose() {
		w = io.MultiWriter(lb, os.Stderr)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})), lb
}

// Logger logs to stderr under -v, and nowhere otherwise.
func Logger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
