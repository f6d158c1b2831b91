package bench

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/blobfs/blobfs/blobstore"
	"golang.org/x/sync/errgroup"
)

// azureEnv is the baseline's side of the Azurite figures: a fresh
// container, and the raw azblob SDK talking to it.
type azureEnv struct {
	endpoint  string // blob endpoint with the account, no trailing "/"
	account   string
	key       string
	container string
	client    *container.Client
}

// newAzureEnv creates a uniquely named container on endpoint.
func newAzureEnv(ctx context.Context, endpoint, key string) (*azureEnv, error) {
	endpoint = strings.TrimSuffix(endpoint, "/")
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("endpoint %q is not a URL like http://127.0.0.1:10000/devstoreaccount1", endpoint)
	}
	account, _, _ := strings.Cut(strings.Trim(u.Path, "/"), "/")
	if account == "" {
		return nil, fmt.Errorf("endpoint %q names no account; expected http://HOST:PORT/ACCOUNT", endpoint)
	}
	var suffix [4]byte
	rand.Read(suffix[:])
	name := fmt.Sprintf("bench-%s-%s", time.Now().UTC().Format("20060102-150405"), hex.EncodeToString(suffix[:]))
	cred, err := container.NewSharedKeyCredential(account, key)
	if err != nil {
		return nil, fmt.Errorf("account key: %w", err)
	}
	client, err := container.NewClientWithSharedKeyCredential(endpoint+"/"+name, cred, &container.ClientOptions{
		ClientOptions: azcore.ClientOptions{Transport: newHTTPClient()},
	})
	if err != nil {
		return nil, err
	}
	if _, err := client.Create(ctx, nil); err != nil {
		return nil, fmt.Errorf("create container %s at %s (is Azurite running? .ci/azurite.sh start): %w", name, endpoint, err)
	}
	return &azureEnv{endpoint: endpoint, account: account, key: key, container: name, client: client}, nil
}

// newHTTPClient is the baseline's transport, tuned as blobfs's own is
// (blobstore's newHTTPClient): a connection pool wide enough for parallel
// transfers, HTTP/1.1, no compression. With net/http's defaults (two idle
// connections per host) a 16-way download would open a connection per
// request, and the baseline would be weaker than the SDK can be.
func newHTTPClient() *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         dialer.DialContext,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ReadBufferSize:      64 << 10,
		WriteBufferSize:     64 << 10,
	}}
}

// storeConfig is the blobstore configuration of the container, for an
// in-process blobfs.
func (a *azureEnv) storeConfig() blobstore.AzureConfig {
	return blobstore.AzureConfig{
		Account:   a.account,
		Container: a.container,
		Endpoint:  a.endpoint,
		Key:       a.key,
		Auth:      blobstore.AzureAuthKey,
	}
}

func (a *azureEnv) blob(name string) *blockblob.Client { return a.client.NewBlockBlobClient(name) }

// close deletes the container and everything in it.
func (a *azureEnv) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := a.client.Delete(ctx, nil)
	return err
}

// size returns a blob's size, or -1 when it does not exist.
func (a *azureEnv) size(ctx context.Context, name string) (int64, error) {
	p, err := a.blob(name).GetProperties(ctx, nil)
	var re *azcore.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
		return -1, nil
	}
	if err != nil {
		return 0, err
	}
	if p.ContentLength == nil {
		return 0, fmt.Errorf("%s: no Content-Length", name)
	}
	return *p.ContentLength, nil
}

// count lists prefix flat, with metadata, and returns how many blobs there
// are: the baseline of the small-list figure.
func (a *azureEnv) count(ctx context.Context, prefix string) (int, error) {
	pager := a.client.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{
		Prefix:  &prefix,
		Include: container.ListBlobsInclude{Metadata: true},
	})
	n := 0
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return 0, err
		}
		if page.Segment != nil {
			n += len(page.Segment.BlobItems)
		}
	}
	return n, nil
}

// upload puts one blob in one request.
func (a *azureEnv) upload(ctx context.Context, name string, data []byte) error {
	_, err := a.blob(name).Upload(ctx, streaming.NopCloser(bytes.NewReader(data)), nil)
	return err
}

// uploadAsBlobfs puts a small blob with the POSIX attributes a file
// written through blobfs carries, so that listing it costs what listing a
// container written by blobfs costs.
func (a *azureEnv) uploadAsBlobfs(ctx context.Context, name string, data []byte) error {
	ns := fmt.Sprint(time.Now().UnixNano())
	md := map[string]*string{
		blobstore.MetaMode: to.Ptr("100644"), blobstore.MetaUID: to.Ptr("1000"),
		blobstore.MetaGID: to.Ptr("1000"), blobstore.MetaAtime: to.Ptr(ns),
	}
	_, err := a.blob(name).Upload(ctx, streaming.NopCloser(bytes.NewReader(data)), &blockblob.UploadOptions{Metadata: md})
	return err
}

// uploadFast puts a large blob with a wide parallel upload; for set-up,
// untimed.
func (a *azureEnv) uploadFast(ctx context.Context, name string, data []byte) error {
	_, err := a.blob(name).UploadBuffer(ctx, data, &blockblob.UploadBufferOptions{BlockSize: 8 * MiB, Concurrency: 16})
	return err
}

// download reads a whole blob with one GET.
func (a *azureEnv) download(ctx context.Context, name string, dst []byte) (int, error) {
	resp, err := a.blob(name).DownloadStream(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.ReadFull(resp.Body, dst)
	if err == io.ErrUnexpectedEOF {
		err = nil
	}
	if err == nil {
		// Anything past len(dst) is a mismatch the caller must see.
		var one [1]byte
		if m, _ := resp.Body.Read(one[:]); m > 0 {
			return n + m, nil
		}
	}
	return n, err
}

// deleteUnder deletes dir's blobs and its marker, best effort.
func (a *azureEnv) deleteUnder(ctx context.Context, dir string) {
	prefix := dir + "/"
	pager := a.client.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{Prefix: &prefix})
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return
		}
		if page.Segment != nil {
			for _, it := range page.Segment.BlobItems {
				if it.Name != nil {
					a.delete(ctx, *it.Name)
				}
			}
		}
	}
	a.delete(ctx, dir)
}

func (a *azureEnv) delete(ctx context.Context, name string) error {
	_, err := a.blob(name).Delete(ctx, nil)
	return err
}

// strategy is one way for the SDK (or a direct store client) to do a
// figure's transfer. Only run is timed; prepare and check, when set, run
// just before and just after it.
type strategy struct {
	name    string
	prepare func() error
	run     func(ctx context.Context) error
	check   func(ctx context.Context) error
}

// downloadStrategies are the SDK's ways to read blob name, whose content
// is want, into dst (len(want) bytes), or into a file under dir.
func (a *azureEnv) downloadStrategies(name string, want, dst []byte, dir string, few bool) []strategy {
	b := a.client.NewBlobClient(name)
	prepare := func() error { clear(dst); return nil }
	check := func(context.Context) error { return verify(dst, want) }
	stream := strategy{"DownloadStream (1 GET)", prepare, func(ctx context.Context) error {
		resp, err := b.DownloadStream(ctx, nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.ReadFull(resp.Body, dst)
		return err
	}, check}
	buffer := func(block int64, conc uint16) strategy {
		return strategy{fmt.Sprintf("DownloadBuffer %s × %d", human(block), conc), prepare, func(ctx context.Context) error {
			n, err := b.DownloadBuffer(ctx, dst, &blob.DownloadBufferOptions{BlockSize: block, Concurrency: conc})
			if err == nil && n != int64(len(dst)) {
				err = fmt.Errorf("DownloadBuffer read %d bytes, want %d", n, len(dst))
			}
			return err
		}, check}
	}
	file := func(block int64, conc uint16) strategy {
		var path string
		return strategy{fmt.Sprintf("DownloadFile %s × %d", human(block), conc), nil, func(ctx context.Context) error {
			f, err := os.CreateTemp(dir, "download-")
			if err != nil {
				return err
			}
			path = f.Name()
			defer f.Close()
			n, err := b.DownloadFile(ctx, f, &blob.DownloadFileOptions{BlockSize: block, Concurrency: conc})
			if err == nil && n != int64(len(dst)) {
				err = fmt.Errorf("DownloadFile wrote %d bytes, want %d", n, len(dst))
			}
			return err
		}, func(context.Context) error {
			defer os.Remove(path)
			got, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return verify(got, want)
		}}
	}
	if few {
		return []strategy{stream, buffer(4*MiB, 8), buffer(8*MiB, 16)}
	}
	return []strategy{stream, buffer(4*MiB, 8), buffer(4*MiB, 16), buffer(8*MiB, 8), buffer(8*MiB, 16),
		buffer(16*MiB, 16), file(8*MiB, 16)}
}

// uploadStrategies are the SDK's ways to write data as a new blob; each
// attempt writes a blob named by newName, checks its size and deletes it.
//
// Only three: every upload stays in an in-memory Azurite until its garbage
// collection runs (every 10 minutes), and Azurite refuses writes beyond its
// memory limit, so each strategy tried costs a whole Config.Size of it.
// Measured on Azurite, the strategies differ little (Azurite's own
// ingest is the bottleneck); these three stage blocks of the sizes the SDK
// is commonly run with, each with its Content-MD5, as blobfs does.
func (a *azureEnv) uploadStrategies(newName func() string, data []byte) []strategy {
	single := int64(len(data)) <= blockblob.MaxUploadBlobBytes
	with := func(label string, upload func(ctx context.Context, b *blockblob.Client) error) strategy {
		var name string
		return strategy{label, func() error { name = newName(); return nil }, func(ctx context.Context) error {
			return upload(ctx, a.blob(name))
		}, func(ctx context.Context) error {
			defer a.delete(ctx, name)
			n, err := a.size(ctx, name)
			if err == nil && n != int64(len(data)) {
				err = fmt.Errorf("%s has %d bytes after the upload, want %d", name, n, len(data))
			}
			return err
		}}
	}
	// staged: what blobfs does, so that the comparison is with the same
	// integrity checks: blocks staged in parallel, each with its
	// Content-MD5, and Put Block List with the MD5 of the whole as the
	// blob's Content-MD5, hashed beside the blocks (as azcopy --put-md5
	// does). (The SDK's UploadBuffer can only compute a CRC64 per block,
	// which Azurite does not check, and no MD5 of the whole.)
	staged := func(block int64, conc int) strategy {
		return with(fmt.Sprintf("StageBlock %s × %d, Content-MD5 each and of the whole", human(block), conc), func(ctx context.Context, b *blockblob.Client) error {
			n := (int64(len(data)) + block - 1) / block
			ids := make([]string, n)
			whole := make(chan [md5.Size]byte, 1)
			go func() { whole <- md5.Sum(data) }()
			g, gctx := errgroup.WithContext(ctx)
			g.SetLimit(conc)
			for i := range n {
				ids[i] = blobstore.BlockID("benchsdk", int(i))
				part := data[i*block : min((i+1)*block, int64(len(data)))]
				g.Go(func() error {
					sum := md5.Sum(part)
					_, err := b.StageBlock(gctx, ids[i], streaming.NopCloser(bytes.NewReader(part)), &blockblob.StageBlockOptions{
						TransactionalValidation: blob.TransferValidationTypeMD5(sum[:]),
					})
					return err
				})
			}
			sum := <-whole
			if err := g.Wait(); err != nil {
				return err
			}
			_, err := b.CommitBlockList(ctx, ids, &blockblob.CommitBlockListOptions{HTTPHeaders: &blob.HTTPHeaders{BlobContentMD5: sum[:]}})
			return err
		})
	}
	if single {
		return []strategy{with("Upload (1 Put Blob), Content-MD5", func(ctx context.Context, b *blockblob.Client) error {
			sum := md5.Sum(data)
			_, err := b.Upload(ctx, streaming.NopCloser(bytes.NewReader(data)), &blockblob.UploadOptions{TransactionalValidation: blob.TransferValidationTypeMD5(sum[:])})
			return err
		}), staged(4*MiB, 8), staged(8*MiB, 16)}
	}
	return []strategy{staged(4*MiB, 8), staged(8*MiB, 16), staged(16*MiB, 16)}
}

// uploadStrategyCount is len(uploadStrategies(...)), for estimating how
// much a run writes.
const uploadStrategyCount = 3
