package csi

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// NodeState is what the node service remembers about its volumes, so that
// a restarted driver knows what kubelet staged and published (kubelet
// does not stage again after a driver restart). Implementations persist
// every change before returning and hand out copies.
type NodeState interface {
	// List returns every volume, sorted by id.
	List() []VolumeRecord
	// Get returns the record of one volume.
	Get(volumeID string) (VolumeRecord, bool)
	// Put stores rec, replacing the volume's previous record.
	Put(rec VolumeRecord) error
	// Delete forgets a volume; forgetting an unknown one is not an error.
	Delete(volumeID string) error
}

// VolumeRecord is the node's record of one volume. It holds no secret:
// credentials passed in a request live in memory only; the record says
// where they came from so that a restarted driver knows whether it can
// mount again by itself.
type VolumeRecord struct {
	VolumeID string `json:"volumeId"`
	// Ephemeral: an inline volume, mounted at its one target, no staging.
	Ephemeral   bool   `json:"ephemeral,omitempty"`
	StagingPath string `json:"stagingPath,omitempty"`

	Account   string `json:"account"`
	Container string `json:"container"`
	Endpoint  string `json:"endpoint,omitempty"`
	// Auth is the blobstore auth mode (key, sas, connstr, azuread).
	Auth string `json:"auth"`
	// CredentialSource is "request" (secrets in the RPC: lost on
	// restart), "secret:NAMESPACE/NAME" (read from the API server) or
	// "identity" (Azure AD workload or managed identity).
	CredentialSource string `json:"credentialSource"`
	IdentityClientID string `json:"identityClientId,omitempty"`
	ReadOnly         bool   `json:"readOnly,omitempty"`
	// MountOptions are the allow-listed options in canonical form.
	MountOptions []string `json:"mountOptions,omitempty"`
	// MountGroup is the group the mount was made for: a pod's fsGroup
	// (volume_mount_group), decimal; empty: none (mountgroup.go).
	MountGroup string `json:"mountGroup,omitempty"`
	// Targets are the published target paths.
	Targets map[string]TargetRecord `json:"targets,omitempty"`
	// DeadDevices are the device numbers (major:minor) of this volume's
	// mounts that died with their FUSE connection and whose copies in
	// running containers' mount namespaces are still to be replaced
	// (views.go). Kept across restarts so that a repair that succeeds
	// later still reaches them.
	DeadDevices []string  `json:"deadDevices,omitempty"`
	Updated     time.Time `json:"updated"`
}

// TargetRecord is one published target.
type TargetRecord struct {
	ReadOnly bool `json:"readOnly,omitempty"`
}

func (r VolumeRecord) clone() VolumeRecord {
	r.MountOptions = slices.Clone(r.MountOptions)
	r.Targets = maps.Clone(r.Targets)
	return r
}

// stateVersion is written into every file; a file of another version is
// refused rather than misread.
const stateVersion = 1

type stateFile struct {
	Version int `json:"version"`
	VolumeRecord
}

// FileState is a NodeState kept as one JSON file per volume in a
// directory: DIR/<sha256 of the volume id>.json, written atomically (temp
// file, fsync, rename, fsync of the directory), so that a crash leaves
// either the old or the new record, never a torn one. mu guards vols and
// serializes writes.
type FileState struct {
	dir  string
	mu   sync.Mutex
	vols map[string]VolumeRecord
}

var _ NodeState = (*FileState)(nil)

// OpenFileState loads the records in dir, creating it if needed. A record
// that cannot be read is reported and skipped: one bad file must not keep
// the driver from starting.
func OpenFileState(dir string) (*FileState, []error, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("node state directory: %w", err)
	}
	s := &FileState{dir: dir, vols: map[string]VolumeRecord{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("node state directory: %w", err)
	}
	var bad []error
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") {
			os.Remove(filepath.Join(dir, name)) // a write cut short
			continue
		}
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			bad = append(bad, err)
			continue
		}
		var f stateFile
		if err := json.Unmarshal(b, &f); err != nil || f.Version != stateVersion || f.VolumeID == "" || name != stateFileName(f.VolumeID) {
			bad = append(bad, fmt.Errorf("node state %s: unreadable or of another version (%v)", name, err))
			continue
		}
		s.vols[f.VolumeID] = f.VolumeRecord
	}
	return s, bad, nil
}

func stateFileName(volumeID string) string {
	sum := sha256.Sum256([]byte(volumeID))
	return hex.EncodeToString(sum[:]) + ".json"
}

func (s *FileState) List() []VolumeRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]VolumeRecord, 0, len(s.vols))
	for _, r := range s.vols {
		out = append(out, r.clone())
	}
	slices.SortFunc(out, func(a, b VolumeRecord) int { return strings.Compare(a.VolumeID, b.VolumeID) })
	return out
}

func (s *FileState) Get(volumeID string) (VolumeRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.vols[volumeID]
	return r.clone(), ok
}

func (s *FileState) Put(rec VolumeRecord) error {
	if rec.VolumeID == "" {
		return errors.New("node state: empty volume id")
	}
	rec = rec.clone()
	rec.Updated = time.Now().UTC().Truncate(time.Millisecond)
	b, err := json.MarshalIndent(stateFile{Version: stateVersion, VolumeRecord: rec}, "", "  ")
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := writeFileAtomic(s.dir, stateFileName(rec.VolumeID), b); err != nil {
		return fmt.Errorf("node state: %w", err)
	}
	s.vols[rec.VolumeID] = rec
	return nil
}

func (s *FileState) Delete(volumeID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := os.Remove(filepath.Join(s.dir, stateFileName(volumeID)))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("node state: %w", err)
	}
	if err == nil {
		if err := syncDir(s.dir); err != nil {
			return fmt.Errorf("node state: %w", err)
		}
	}
	delete(s.vols, volumeID)
	return nil
}

// writeFileAtomic replaces dir/name with data: temp file, fsync, rename,
// fsync of the directory.
func writeFileAtomic(dir, name string, data []byte) error {
	f, err := os.CreateTemp(dir, ".tmp-"+name+"-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
