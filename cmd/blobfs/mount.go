package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/spf13/pflag"
	mountutils "k8s.io/mount-utils"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
	"github.com/blobfs/blobfs/fusefs/cache"
	"github.com/blobfs/blobfs/fusefs/fsmetrics"
	"github.com/blobfs/blobfs/fusefs/kernel"
	"github.com/blobfs/blobfs/fusefs/listing"
	"github.com/blobfs/blobfs/mountopt"
)

// mountConfig is everything `blobfs mount` is told, from flags and the
// environment.
type mountConfig struct {
	// Store selection: a local directory, or an Azure container.
	localDir string
	azure    blobstore.AzureConfig
	// The filesystem's options (mountopt), and --cache-dir in its FS.
	mountopt.Settings
	// options are the flags of the table, for checkFlags.
	options   []*optionFlag
	listMB    int64
	disk      diskCacheFlags
	fg        bool
	log       logFlags
	checkTime time.Duration
	grace     time.Duration
	create    bool
	limit     int
	nonEmpty  bool
	// metricsAddr, when set, serves the mount's Prometheus metrics.
	metricsAddr string
}

// registerMountFlags declares every mount flag; mount.blobfs -o options are
// the same names. The filesystem's options come from mountopt's table,
// which CSI volumes share; the flags that pick the store, place the
// process's files and say how it runs are declared here, as they are
// this command's alone (mountopt's package doc says why). Keep the table
// in docs/reference.md in step (docs_test.go checks).
func registerMountFlags(fl *pflag.FlagSet, c *mountConfig) {
	fl.StringVar(&c.localDir, "local-dir", "", "serve this local directory as the container (the default store when no Azure container is configured)")
	fl.StringVar(&c.azure.Container, "container", c.azure.Container, "Azure container name (env AZURE_STORAGE_ACCOUNT_CONTAINER)")
	fl.StringVar(&c.azure.Account, "account", c.azure.Account, "Azure storage account (env AZURE_STORAGE_ACCOUNT)")
	fl.StringVar(&c.azure.Endpoint, "endpoint", c.azure.Endpoint, "blob service URL, e.g. http://127.0.0.1:10000/devstoreaccount1 (env AZURE_STORAGE_BLOB_ENDPOINT)")
	fl.StringVar(&c.azure.Auth, "auth-type", c.azure.Auth, "key, sas, connstr, anonymous or azuread (env AZURE_STORAGE_AUTH_TYPE); default: whichever credential is given")
	fl.BoolVar(&c.create, "create-container", false, "create the Azure container if it does not exist")
	fl.StringVar(&c.azure.ClientID, "identity-client-id", c.azure.ClientID, "client id of a user-assigned managed identity (azuread)")
	fl.StringVar(&c.FS.CacheDir, "cache-dir", "", "directory for spill files of files being written (default: a new directory under $TMPDIR)")
	fl.Int64Var(&c.listMB, "list-cache-mb", listing.DefaultListCacheBytes>>20, "memory for cached directory listings, MiB (about 200 bytes a name); the oldest are dropped first")
	fl.Int64Var(&c.disk.mb, "disk-cache-mb", 0, "disk space for content read, MiB (0: no disk cache); on a read-only mount, files held whole are read by the kernel itself (FUSE passthrough)")
	fl.StringVar(&c.disk.dir, "disk-cache-dir", "", "directory of the disk cache, on a local disk; emptied at mount (default: disk/ in the cache directory)")
	// Files that store no owner are the caller's: the table has no
	// default for the ids of whoever mounts.
	caller := map[string]string{"uid": strconv.Itoa(os.Getuid()), "gid": strconv.Itoa(os.Getgid())}
	for i := range mountopt.Table {
		o := &mountopt.Table[i]
		def, ok := caller[o.Name]
		if !ok {
			def = o.Default
		}
		f := newOptionFlag(o, &c.Settings, def)
		c.options = append(c.options, f)
		flag := fl.VarPF(f, o.Name, "", o.Help)
		if o.Kind == mountopt.Bool {
			flag.NoOptDefVal = "true"
		}
	}
	fl.BoolVar(&c.fg, "foreground", false, "stay in the foreground (default: detach once mounted)")
	c.log.register(fl)
	fl.StringVar(&c.log.file, "log-file", "", "log to this file, opened again at SIGHUP (default: stderr in the foreground; in the background /var/log/blobfs/blobfs-MOUNTPOINT.log as root, else under $TMPDIR)")
	fl.DurationVar(&c.checkTime, "check-timeout", 30*time.Second, "how long the pre-mount check of the store may take")
	fl.IntVar(&c.limit, "restart-limit", 10, "in the background: the supervisor gives up at this many worker crashes in a row (each within 10s of its start), having restarted the worker after each one before (10: 9 restarts); 0 or 1: never restart")
	fl.DurationVar(&c.grace, "shutdown-grace", 10*time.Second, "on SIGTERM with files still open, how long to keep serving them (detached) before exiting")
	fl.BoolVar(&c.nonEmpty, "nonempty", false, "allow mounting over a directory that is not empty (its files are hidden while mounted)")
	fl.StringVar(&c.metricsAddr, "metrics-address", "", "serve Prometheus metrics at http://ADDRESS/metrics, e.g. 127.0.0.1:9810 (default: off)")
}

// optionFlag is an option of mountopt's table as a flag: a value given is
// parsed and applied to the settings at once, and its bounds are checked
// by checkFlags, which names the flag and its unit.
type optionFlag struct {
	opt *mountopt.Option
	s   *mountopt.Settings
	v   mountopt.Value
}

// newOptionFlag applies def, the flag's default ("" none), to s.
func newOptionFlag(o *mountopt.Option, s *mountopt.Settings, def string) *optionFlag {
	f := &optionFlag{opt: o, s: s}
	if def != "" {
		v, err := o.Parse(def)
		if err != nil {
			panic("mount option " + o.Name + ": default " + def + ": " + err.Error()) // mountopt's tests check its defaults
		}
		f.v = v
		o.ApplyDefault(s, v)
	}
	return f
}

func (f *optionFlag) Set(raw string) error {
	v, err := f.opt.Parse(raw)
	if err != nil {
		return err
	}
	f.v = v
	f.opt.Apply(f.s, v)
	return nil
}

// String is the value as the flag takes it back: the worker and the
// background process are run with it (givenArgs). Zero is "0", which
// --help takes for "no default".
func (f *optionFlag) String() string { return f.opt.Format(f.v) }

// Type names the value in --help: "--umask octal".
func (f *optionFlag) Type() string { return f.opt.Kind.String() }

// IsBoolFlag: --help shows a boolean as "--read-only[=true|false]".
func (f *optionFlag) IsBoolFlag() bool { return f.opt.Kind == mountopt.Bool }

// storeFlags select an Azure container; --local-dir selects a local
// directory instead, and the two do not mix.
var storeFlags = []string{"container", "account", "endpoint", "auth-type", "create-container", "identity-client-id"}

// checkFlags refuses flag values that cannot work, before anything is
// mounted, with errors in the flags' own names and units.
func (c *mountConfig) checkFlags(fl *pflag.FlagSet) error {
	set := map[string]bool{}
	fl.Visit(func(f *pflag.Flag) { set[f.Name] = true })
	if set["local-dir"] {
		for _, f := range storeFlags {
			if set[f] {
				return fmt.Errorf("--local-dir and --%s name two different stores: give one (--local-dir serves a local directory, --%s belongs to an Azure container)", f, f)
			}
		}
	}
	for _, f := range c.options {
		if err := f.opt.Check(f.v); err != nil {
			return fmt.Errorf("--%s %s: %v", f.opt.Name, f, err)
		}
	}
	cacheMB, readMB := c.FS.BlockCacheBytes>>20, c.FS.ReadBlockSize>>20
	switch {
	case cacheMB < 2*readMB:
		return fmt.Errorf("--block-cache-mb %d: must hold at least two read blocks of --read-block-mb %d, so %d MiB or more", cacheMB, readMB, 2*readMB)
	case c.listMB < 1 || c.listMB > 1<<20:
		return fmt.Errorf("--list-cache-mb %d: must be between 1 and 1048576 (MiB)", c.listMB)
	case c.disk.check() != nil:
		return c.disk.check()
	case c.checkTime <= 0:
		return fmt.Errorf("--check-timeout %v: must be positive", c.checkTime)
	case c.grace < 0:
		return fmt.Errorf("--shutdown-grace %v: must not be negative", c.grace)
	case c.limit < 0:
		return fmt.Errorf("--restart-limit %d: must not be negative (0 and 1 give up at the first crash)", c.limit)
	}
	return c.log.check()
}

func newMountConfig() *mountConfig {
	return &mountConfig{azure: blobstore.AzureConfigFromEnv(os.Getenv)}
}

// runMount is `blobfs mount`, its flags parsed into c and fl.
func runMount(c *mountConfig, fl *pflag.FlagSet, args []string) error {
	if err := c.checkFlags(fl); err != nil {
		return usageError{err}
	}
	if len(args) != 1 {
		return usageError{errors.New("mount needs exactly one MOUNTPOINT (see blobfs mount --help)")}
	}
	return mountWith(c, args[0], givenArgs(fl, args))
}

// givenArgs are the flags given on a command line, in their long form
// (--name=value), and then its arguments: what the background process and
// its worker are run with.
func givenArgs(fl *pflag.FlagSet, args []string) []string {
	var out []string
	fl.Visit(func(f *pflag.Flag) {
		if f.Name != "help" {
			out = append(out, "--"+f.Name+"="+f.Value.String())
		}
	})
	return append(out, args...)
}

// azureConfigured tells whether the user asked for an Azure container.
func (c *mountConfig) azureConfigured() bool {
	a := c.azure
	return c.localDir == "" && (a.Container != "" || a.Account != "" || a.ConnectionString != "" || a.Endpoint != "")
}

// storeID names the store in the records of spill files (see
// fusefs.Options.StoreID).
func (c *mountConfig) storeID() string {
	if c.azureConfigured() {
		return "azure:" + c.azure.ID()
	}
	dir := c.localDir
	if dir == "" {
		dir = defaultLocalDir()
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return "local:" + dir
}

// defaultLocalDir is the embedded default store.
func defaultLocalDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/blobfs/local"
	}
	if d, err := os.UserHomeDir(); err == nil {
		return filepath.Join(d, ".local", "share", "blobfs", "local")
	}
	return filepath.Join(os.TempDir(), "blobfs-local")
}

// openStore builds the store and checks it before anything is mounted. At
// debug level every store request is logged to logger; at any level, a
// request still running after 30 s is logged at WARN (blobstore.NewWatched).
// vol, if not nil, counts its requests (each try) and reports the oldest in
// flight.
func (c *mountConfig) openStore(ctx context.Context, logger *slog.Logger, vol *fsmetrics.Volume) (blobstore.Store, string, error) {
	var (
		raw  blobstore.Store
		desc string
	)
	if c.azureConfigured() {
		if c.azure.Container == "" {
			return nil, "", errors.New("no container given: set --container or AZURE_STORAGE_ACCOUNT_CONTAINER")
		}
		if err := c.azure.Validate(); err != nil {
			return nil, "", err
		}
		blobstore.WarnSASExpiry(logger, c.azure, time.Now())
		blobstore.NoteAuthMode(logger, c.azure)
		if c.create {
			cctx, cancel := context.WithTimeout(ctx, c.checkTime)
			err := blobstore.CreateContainer(cctx, c.azure, nil)
			timedOut := errors.Is(cctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
			cancel()
			if timedOut {
				return nil, "", fmt.Errorf("create container: %s: no answer within %v (--check-timeout): is the endpoint reachable? (%w)", c.azure, c.checkTime, err)
			}
			if err != nil {
				return nil, "", fmt.Errorf("create container: %w", err)
			}
		}
		az, err := blobstore.NewAzure(c.azure)
		if err != nil {
			return nil, "", err
		}
		raw, desc = az, c.azure.String()
	} else {
		dir := c.localDir
		if dir == "" {
			// The embedded default is created on first use; a directory
			// named by the user must exist, so a typo is not a new store.
			dir = defaultLocalDir()
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, "", fmt.Errorf("local store: %w", err)
			}
		} else if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return nil, "", fmt.Errorf("--local-dir %s: not an existing directory", dir)
		}
		l, err := blobstore.NewLocal(dir)
		if err != nil {
			return nil, "", err
		}
		raw, desc = l, "local directory "+dir
	}
	logged := blobstore.NewLogged(raw, logger)
	if vol != nil {
		logged = vol.InstrumentStore(logged)
	}
	watched := blobstore.NewWatched(logged, blobstore.WatchOptions{Log: logger})
	if vol != nil {
		vol.WatchStore(watched)
	}
	store := blobstore.NewRetrying(watched, c.Retry)
	cctx, cancel := context.WithTimeout(ctx, c.checkTime)
	defer cancel()
	if err := store.Check(cctx); err != nil {
		if errors.Is(cctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, "", fmt.Errorf("%s: no answer within %v (--check-timeout): is the endpoint reachable? (%w)", desc, c.checkTime, err)
		}
		if c.azureConfigured() {
			return nil, "", err // it names the container and the endpoint
		}
		return nil, "", fmt.Errorf("%s: %w", desc, err)
	}
	return store, desc, nil
}

// fsName is the mount's source in /proc/mounts and mount(8)'s output:
// blobfs:CONTAINER as for the CSI driver's mounts, blobfs:local for a
// local directory (a path could hold the commas that separate mount
// options).
func (c *mountConfig) fsName() string {
	if c.azureConfigured() {
		return "blobfs:" + c.azure.Container
	}
	return "blobfs:local"
}

func (c *mountConfig) fsOptions(logger *slog.Logger) (fusefs.Options, error) {
	o := c.FS
	o.StoreID = c.storeID()
	o.Logger = logger
	return o, nil
}

// readyEnv names the fd on which a background child reports "mounted" (or
// an error) to the parent waiting in the foreground.
const readyEnv = "BLOBFS_READY_FD"

func mountWith(c *mountConfig, mountpoint string, args []string) error {
	mp, err := filepath.Abs(mountpoint)
	if err != nil {
		return err
	}
	readyFD := os.Getenv(readyEnv)
	if readyFD == "" {
		// Checked once, by the command the user ran; its background
		// child finds the same directory.
		if err := checkMountpoint(mp, c.nonEmpty); err != nil {
			return err
		}
	}
	if !c.fg && readyFD == "" {
		return daemonize(args, mp)
	}
	if readyFD != "" {
		// The detached child of daemonize: the supervisor of a worker.
		var fd int
		fmt.Sscan(readyFD, &fd)
		os.Unsetenv(readyEnv)
		return supervise(c, mp, args, readyReporter(os.NewFile(uintptr(fd), "ready")))
	}
	logger, logFile, err := newLogger(c.log, os.Stderr)
	if err != nil {
		return err
	}
	if logFile != nil {
		defer logFile.Close()
	}
	defer reopenOnSIGHUP(logger, logFile)()
	// The default cache directory is made here, not by fusefs, so that
	// it goes again with the mount: nobody would look in a fresh
	// temporary directory of a mount that is gone.
	madeCacheDir := ""
	if c.FS.CacheDir == "" {
		if c.FS.CacheDir, err = makeCacheDir(); err != nil {
			return err
		}
		madeCacheDir = c.FS.CacheDir
	}
	// In the foreground, one process mounts and serves: it has no
	// supervisor to hold the mount, so the mount dies with it.
	err = serve(c, mp, logger, func(err error, desc string) {
		if err == nil {
			fmt.Fprintf(os.Stderr, "blobfs: mounted %s at %s\n", desc, mp)
		}
	}, nil)
	if madeCacheDir != "" {
		removeMadeCacheDir(madeCacheDir, logger)
	}
	return err
}

// makeCacheDir makes the default cache directory of a mount that names
// none: a fresh temporary one, removed again by removeMadeCacheDir.
func makeCacheDir() (string, error) {
	dir, err := os.MkdirTemp("", "blobfs-cache-")
	if err != nil {
		return "", fmt.Errorf("cache directory: %w", err)
	}
	return dir, nil
}

// removeMadeCacheDir removes a cache directory that this command made, once
// its mount is gone. Only empty directories go: data that could not be
// uploaded (lost+found, or spill files after a failed upload) stays, and
// the log says where.
func removeMadeCacheDir(dir string, logger *slog.Logger) {
	for _, sub := range []string{"spill", "lost+found"} {
		os.Remove(filepath.Join(dir, sub))
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		logger.Warn("cache directory kept: it holds data that was not uploaded", "dir", dir, "err", err)
	}
}

// readyReporter returns a function that tells the process waiting on pipe
// "ok DESCRIPTION" or "error MESSAGE", once; later calls do nothing.
func readyReporter(pipe *os.File) func(error, string) {
	var once sync.Once
	return func(err error, desc string) {
		once.Do(func() {
			if err != nil {
				fmt.Fprintln(pipe, "error", strings.ReplaceAll(err.Error(), "\n", " "))
			} else {
				fmt.Fprintln(pipe, "ok", desc)
			}
			pipe.Close()
		})
	}
}

// backgroundLogFile is where a detached mount logs unless --log-file says.
func backgroundLogFile(mp string) string {
	name := strings.Trim(strings.ReplaceAll(mp, "/", "-"), "-")
	dir := "/var/log/blobfs"
	if os.Geteuid() != 0 || os.MkdirAll(dir, 0o755) != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "blobfs-"+name+".log")
}

// keptMount is a mount made and held by a supervisor, served by this
// process (a worker): its /dev/fuse descriptor and its state region.
type keptMount struct {
	fuseFD int
	state  *os.File
	// unservedSince is when the previous worker stopped serving the
	// mount (zero for the first): the restart's pause ends when this
	// one serves.
	unservedSince time.Time
}

// serve serves the mount at mp until it is unmounted or a signal asks to
// stop. With kept nil it mounts; otherwise it serves the supervisor's
// mount, adopting it when the state region says a previous worker served
// it. ready is told once the mount is usable (or why it is not).
func serve(c *mountConfig, mp string, logger *slog.Logger, ready func(error, string), kept *keptMount) error {
	ctx, stop := signalContext(logger, "dirty files are uploaded, then the mount is unmounted")
	defer stop()
	var (
		metrics *fsmetrics.Metrics
		vol     *fsmetrics.Volume
	)
	if c.metricsAddr != "" {
		// Listening first: an address in use fails the mount before it
		// is made, with the flag named.
		metrics = fsmetrics.New()
		srv, addr, err := metrics.Serve(c.metricsAddr)
		if err != nil {
			err = fmt.Errorf("--metrics-address %s: %w", c.metricsAddr, err)
			ready(err, "")
			return err
		}
		defer srv.Close()
		logger.Info("serving metrics", "address", "http://"+addr.String()+"/metrics")
		vol = metrics.NewVolume(mp)
	}
	store, desc, err := c.openStore(ctx, logger, vol)
	if err != nil {
		ready(err, "")
		return err
	}
	opts, err := c.fsOptions(logger)
	if err != nil {
		ready(err, "")
		return err
	}
	listing.SetListCacheBytes(c.listMB << 20)
	if kept != nil {
		opts.State = kept.state
	}
	if c.disk.mb > 0 && c.disk.dir == "" {
		c.disk.dir = filepath.Join(opts.CacheDir, "disk")
	}
	if opts.DiskCache, err = c.disk.open(logger); err != nil {
		ready(err, "")
		return err
	}
	if opts.DiskCache != nil {
		defer opts.DiskCache.Close()
	}
	fsys, err := fusefs.New(store, opts)
	if err != nil {
		ready(err, "")
		return err
	}
	defer fsys.Close()
	setMemoryLimit(fsys.Options())

	mo := c.Mount
	mo.ReadOnly = opts.ReadOnly
	mo.FsName = c.fsName()
	mo.Logger = logger
	var served fuse.RawFileSystem = fsys
	if metrics != nil {
		served = metrics.InstrumentFS(fsys)
		vol.Track(fsys)
		defer metrics.Untrack(fsys)
	}
	var sess *kernel.Session
	if kept == nil {
		sess, err = kernel.Mount(mp, served, mo)
	} else {
		sess, err = kernel.Serve(mp, kept.fuseFD, served, mo)
	}
	if err != nil {
		ready(err, "")
		return err
	}
	if kept != nil && fsys.AdoptInit() != nil {
		attrs := []any{"store", desc, "mountpoint", mp}
		if !kept.unservedSince.IsZero() {
			pause := time.Since(kept.unservedSince)
			attrs = append(attrs, "unserved_for", pause.Round(time.Millisecond))
			if metrics != nil {
				metrics.ObserveRestartPause(pause)
			}
		}
		logger.Info("adopted the live mount", attrs...)
	} else {
		logger.Info("mounted", "store", desc, "mountpoint", mp)
	}
	ready(nil, desc)
	return serveUntilEnd(ctx, c, mp, logger, fsys, sess)
}

// setMemoryLimit keeps the heap near what the caches are allowed, so that
// the process stays within its configured memory: the block cache (its
// full-size blocks are mapped outside the heap, but a cache full of small
// files is all heap), the blocks of files being written that are in flight
// (fusefs.Options.UploadConcurrency), the buffers of files being fetched
// whole into a disk cache, request buffers. A limit below what is in use
// would make the GC run without pause.
func setMemoryLimit(fo fusefs.Options) {
	limit := fo.BlockCacheBytes + 2*int64(fo.UploadConcurrency)*fo.UploadBlockSize + 48<<20
	if fo.DiskCache != nil {
		limit += cache.DiskFillBytes
	}
	debug.SetMemoryLimit(limit)
}

// serveUntilEnd serves the mount until it is unmounted from outside, or a
// signal ends ctx: then dirty files are uploaded and the mount unmounted
// (lazily, with c.grace for the files still open, when it is busy).
func serveUntilEnd(ctx context.Context, c *mountConfig, mp string, logger *slog.Logger, fsys *fusefs.FS, sess *kernel.Session) error {
	done := make(chan error, 1)
	go func() { done <- sess.Wait() }()
	select {
	case err := <-done:
		// Unmounted from outside (umount, blobfs unmount).
		logger.Info("unmounted", "mountpoint", mp)
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if serr := fsys.Sync(sctx); serr != nil {
			logger.Error("upload after unmount failed", "err", serr)
		}
		fsys.Unmounted()
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := fsys.Sync(sctx); err != nil {
		logger.Error("upload before unmount failed; data kept in the cache directory", "err", err)
	}
	gone := true // no request can come any more
	if err := sess.Unmount(false); err != nil {
		// Files are still open: detach the mount from the namespace now
		// and serve the open files a little longer, then upload what
		// they wrote meanwhile and go.
		logger.Warn("mount busy; detaching lazily", "err", err, "grace", c.grace)
		if err := kernel.Unmount(mp, true); err != nil {
			return fmt.Errorf("unmount %s: %w", mp, err)
		}
		select {
		case <-done:
		case <-time.After(c.grace):
			// Still served until the process exits: their spill
			// files stay theirs.
			logger.Warn("files still open after the grace period; exiting")
			gone = false
		}
		if err := fsys.Sync(sctx); err != nil {
			logger.Error("upload before exit failed; data kept in the cache directory", "err", err)
		}
	}
	if gone {
		fsys.Unmounted()
	}
	return nil
}

// daemonize re-runs this command in the background and returns once the
// child has mounted (or failed, with its error).
func daemonize(args []string, mp string) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, append([]string{"mount"}, args...)...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=3", readyEnv))
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// The child reports through the pipe and logs to its log file; it
	// must not hold on to this terminal.
	if cmd.Stdin, err = os.Open(os.DevNull); err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	status, msg, _ := strings.Cut(strings.TrimSpace(line), " ")
	if status == "ok" {
		cmd.Process.Release()
		fmt.Fprintf(os.Stderr, "blobfs: mounted %s at %s (in the background; unmount with: blobfs unmount %s)\n", msg, mp, mp)
		return nil
	}
	cmd.Wait()
	if msg == "" {
		return errors.New("background mount exited before mounting")
	}
	return errors.New(msg)
}

// checkMountpoint refuses a mountpoint that would hide data or stack a
// second mount, as blobfuse2 and rclone do: it must be an existing, empty
// directory (nonEmpty allows files) that is not a mount point already.
func checkMountpoint(mp string, nonEmpty bool) error {
	st, err := os.Stat(mp)
	switch {
	case errors.Is(err, syscall.ENOTCONN):
		return fmt.Errorf("mountpoint %s is a dead mount (transport endpoint is not connected): remove it with blobfs unmount %s, then mount again", mp, mp)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("mountpoint %s does not exist: create the directory first", mp)
	case err != nil:
		return fmt.Errorf("mountpoint %s: %w", mp, err)
	case !st.IsDir():
		return fmt.Errorf("mountpoint %s is not a directory", mp)
	}
	if what := mountedAt(mp); what != "" {
		return fmt.Errorf("mountpoint %s is already a mount point (%s): unmount it first, or choose another directory", mp, what)
	}
	if nonEmpty {
		return nil
	}
	d, err := os.Open(mp)
	if err != nil {
		return fmt.Errorf("mountpoint %s: %w", mp, err)
	}
	names, _ := d.Readdirnames(1)
	d.Close()
	if len(names) > 0 {
		return fmt.Errorf("mountpoint %s is not empty: the mount would hide its files; choose an empty directory, or pass --nonempty (-o nonempty) to mount over them", mp)
	}
	return nil
}

// mountedAt describes the mount whose mount point is exactly path ("fuse.blobfs
// blobfs", "tmpfs tmpfs"), or returns "" when there is none.
func mountedAt(path string) string {
	if mi, ok := mountAt(path); ok {
		return mi.FsType + " " + mi.Source
	}
	return ""
}

// mountAt is the mount table's entry for the mount whose mount point is
// exactly path: the top one where mounts are stacked, which umount(2)
// would detach. The table is read, nothing on the mount is asked, so a
// dead or hung mount is found like any other.
func mountAt(path string) (mountutils.MountInfo, bool) {
	infos, err := mountutils.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		return mountutils.MountInfo{}, false
	}
	for i := len(infos) - 1; i >= 0; i-- {
		if fusefs.UnescapeMountInfo(infos[i].MountPoint) == path {
			return infos[i], true
		}
	}
	return mountutils.MountInfo{}, false
}

// blobfsFsType is the file system type of every blobfs mount in the mount
// table (fusefs mounts FUSE with the subtype blobfs), a dead one included.
const blobfsFsType = "fuse.blobfs"

// unmountBusyWait is how long unmountPath tries again while the mount is
// busy.
const unmountBusyWait = time.Second

// unmountPath detaches the blobfs mount at mp, and nothing else: a path
// where another file system is mounted (a tmpfs, /proc) is refused, as is
// one where nothing is. A dead blobfs mount (ENOTCONN) is detached like a
// live one: it is found in the mount table, not by asking the mount.
func unmountPath(mp string, lazy bool) error {
	abs, err := filepath.Abs(mp)
	if err != nil {
		return err
	}
	mi, ok := mountAt(abs)
	if !ok {
		// The mount table has resolved paths: umount(2) follows a
		// symlink, so look where it would.
		resolved, err := filepath.EvalSymlinks(abs)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("unmount %s: no such directory", abs)
		}
		if err == nil {
			if mi, ok = mountAt(resolved); ok {
				abs = resolved
			}
		}
	}
	switch {
	case !ok:
		return fmt.Errorf("unmount %s: not mounted", abs)
	case mi.FsType != blobfsFsType:
		return fmt.Errorf("unmount: %s is a mount of type %s (source %q), not blobfs; refusing", abs, mi.FsType, mi.Source)
	}
	err = kernel.Unmount(abs, lazy)
	// A file closed just before keeps the mount busy until blobfs has
	// answered the kernel's RELEASE for it, which the kernel sends after
	// close returns: `cp f /mnt && blobfs unmount /mnt` would often fail.
	// A short wait tells that apart from a process holding a file.
	for deadline := time.Now().Add(unmountBusyWait); errors.Is(err, syscall.EBUSY) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		err = kernel.Unmount(abs, lazy)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOENT):
		return fmt.Errorf("unmount %s: no such directory", abs)
	case errors.Is(err, syscall.EINVAL) && mountedAt(abs) == "":
		return fmt.Errorf("unmount %s: not mounted", abs)
	case errors.Is(err, syscall.EBUSY):
		return fmt.Errorf("unmount %s: busy: a process has a file or its working directory there; stop it, or detach now and unmount once it is done with blobfs unmount -z %s", abs, abs)
	}
	return fmt.Errorf("unmount %s: %w", abs, err)
}
