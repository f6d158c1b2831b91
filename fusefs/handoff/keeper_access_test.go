package handoff

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore/storetest"
)

// The test binary doubles as a keeper client of another user
// (TestKeeperRefusesOtherUsers): with keeperPeerEnv set it adopts from the
// socket it names.
func TestMain(m *testing.M) {
	if sock := os.Getenv(keeperPeerEnv); sock != "" {
		peerAdopt(sock)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// keeperPeerEnv makes the test binary a keeper client that adopts from the
// socket it names and prints what it gets (peerAdopt).
const keeperPeerEnv = "BLOBFS_TEST_KEEPER_PEER"

// peerAdopt asks the keeper at sock for every mount, as a restarted driver
// does, and prints one line per message: "mount KEY RECORD", "end", and
// "closed ERR" when the keeper hangs up.
func peerAdopt(sock string) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		fmt.Println("dial", err)
		return
	}
	sc := seqConn{c}
	defer c.Close()
	if err := sc.send(keeperMsg{Op: "adopt"}); err != nil {
		fmt.Println("closed", err)
		return
	}
	for {
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		m, fds, err := sc.recv()
		closeFDs(fds)
		if err != nil {
			fmt.Println("closed", err)
			return
		}
		switch m.Op {
		case "mount":
			fmt.Println("mount", m.Key, string(m.Record))
		case "end":
			fmt.Println("end")
			return
		default:
			fmt.Println(m.Op, m.Error)
		}
	}
}

// TestKeeperRefusesOtherUsers: a process of another user that connects to
// the keeper's socket — here even with the socket file's mode opened up,
// so that only the keeper's own check stands in the way — gets no mount
// and no record (they hold credentials), the owner keeps serving, and the
// keeper logs the refusal. A process of the keeper's own user (the driver)
// adopts as before.
func TestKeeperRefusesOtherUsers(t *testing.T) {
	// A directory every user can reach, holding the socket and a copy of
	// this test binary.
	dir, bin := storetest.BinaryForOtherUsers(t, "blobfs-keeper-peer-")

	const nobody = 65534
	cases := []struct {
		name       string
		cred       *syscall.Credential // nil: the keeper's own user
		wantMounts bool
	}{
		{"keeper's own user adopts", nil, true},
		{"another user gets nothing", &syscall.Credential{Uid: nobody, Gid: nobody}, false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(dir, fmt.Sprintf("keeper%d.sock", i))
			log, logged := storetest.CapturingLogger(t)
			k := NewKeeper(sock, log)
			startKeeperWith(t, k, sock)
			released := make(chan struct{})
			owner := Dial(sock, storetest.Logger(t), func() { close(released) })
			defer owner.Close()
			holdTestMount(t, owner, "/a")
			if err := os.Chmod(sock, 0o666); err != nil {
				t.Fatal(err)
			}

			cmd := exec.Command(bin, "-test.run=^$")
			cmd.Env = append(os.Environ(), keeperPeerEnv+"="+sock)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: tc.cred}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("peer: %v\n%s", err, out)
			}
			t.Logf("peer saw:\n%s", out)
			gotRecord := strings.Contains(string(out), "mount /a record of /a")
			if gotRecord != tc.wantMounts {
				t.Fatalf("peer got the mount and its record: %v, want %v; it saw:\n%s", gotRecord, tc.wantMounts, out)
			}
			if tc.wantMounts {
				return
			}
			if !strings.Contains(string(out), "closed") {
				t.Errorf("the keeper did not hang up on the other user:\n%s", out)
			}
			select {
			case <-released:
				t.Error("the owner was told to release its mounts to another user")
			default:
			}
			if got := k.Mounts(); len(got) != 1 || got[0] != "/a" {
				t.Errorf("keeper holds %v after the refusal, want [/a]", got)
			}
			if l := logged.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, fmt.Sprintf("uid=%d", nobody)) {
				t.Errorf("no warning naming uid %d in the keeper's log:\n%s", nobody, l)
			}
			// The owner is still served: it can hold another mount.
			holdTestMount(t, owner, "/b")
		})
	}
}

// TestKeeperSocketNeverReachableWithLooserMode: the keeper's socket
// appears at its path only with mode 0600. The socket's directory is
// watched while a keeper starts: a socket file created there (inotify
// IN_CREATE) would be connectable by anyone with the directory's
// permissions until the chmod that follows; the socket must arrive by a
// rename instead, and with mode 0600 already.
func TestKeeperSocketNeverReachableWithLooserMode(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "keeper.sock")
	ino, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ino)
	if _, err := unix.InotifyAddWatch(ino, dir, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ATTRIB); err != nil {
		t.Fatal(err)
	}
	startKeeper(t, sock)

	buf := make([]byte, 64<<10)
	n, err := unix.Read(ino, buf)
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	arrived := false
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
		off += unix.SizeofInotifyEvent + int(ev.Len)
		isDir := ev.Mask&unix.IN_ISDIR != 0
		switch {
		case ev.Mask&unix.IN_CREATE != 0 && !isDir:
			events = append(events, "created "+name)
			t.Errorf("%s was created in the socket's directory: reachable before its mode was set", name)
		case ev.Mask&unix.IN_ATTRIB != 0 && !isDir:
			events = append(events, "chmod "+name)
			t.Errorf("%s had its mode changed where others could reach it", name)
		case ev.Mask&unix.IN_MOVED_TO != 0 && name == filepath.Base(sock):
			events = append(events, "renamed to "+name)
			arrived = true
		case isDir && ev.Mask&unix.IN_CREATE != 0:
			events = append(events, "mkdir "+name)
		}
	}
	t.Logf("events: %v", events)
	if !arrived {
		t.Errorf("the socket did not arrive by a rename: events %v", events)
	}
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want a socket with 0600", fi.Mode())
	}
	// The private directory it was bound in is gone.
	if left, _ := filepath.Glob(filepath.Join(dir, ".keeper.sock.bind-*")); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}
