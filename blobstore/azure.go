package blobstore

// The Azure Blob Storage backend: one container through the azblob SDK.
//
// Design notes:
//   - The SDK's retries are off (one try per call, bounded by a per-try
//     timeout); NewRetrying decides what to retry. Every SDK error goes
//     through Azure.mapError (mapAzureError, then what only the store
//     knows: its per-try timeout), which attaches one sentinel and keeps
//     the SDK error for logs.
//   - Metadata keys come back from GetProperties as canonicalized HTTP
//     header names ("Hdi_isfolder"), from listings as stored. Azure treats
//     them case-insensitively, so this backend reports every key in lower
//     case; the layout's own keys (hdi_isfolder, is_symlink, blobfs_mtime)
//     are lower case already.
//   - ETags come quoted in headers and unquoted in listings; both are
//     reported quoted so that callers can compare them.
//   - Put Block List and Set Blob Metadata do not return the blob's size:
//     CommitBlocks reads it back with a GetProperties conditional on the new
//     ETag (attrsAfterCommit); SetMetadata reads it first and makes the
//     update conditional on what it read.

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/tls"
	"crypto/x509"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
)

// Copy polling: same-account copies usually finish within the Copy Blob
// request itself; otherwise poll with a growing interval, for at most
// copyPollLimit (the caller's context may end it sooner).
const (
	copyPollFirst = 20 * time.Millisecond
	copyPollMax   = 2 * time.Second
	copyPollLimit = 15 * time.Minute
)

// Azure is a Store over one Azure Blob Storage container. It is safe for
// concurrent use.
type Azure struct {
	target azureTarget // validated configuration (holds secrets: never print)
	hc     *http.Client
	client *container.Client
}

var _ Store = (*Azure)(nil)

// NewAzure validates cfg and returns a store for its container. It does no
// network I/O; call Check to verify the container and the credentials.
func NewAzure(cfg AzureConfig) (*Azure, error) {
	t, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	hc := newHTTPClient(true)
	c, err := t.newContainerClient(hc)
	if err != nil {
		return nil, RedactError(err)
	}
	return &Azure{target: t, hc: hc, client: c}, nil
}

// String names the store for logs, without secrets.
func (a *Azure) String() string {
	return fmt.Sprintf("azure container %q at %s", a.target.container, a.target.serviceURL)
}

// Stat implements Store.
func (a *Azure) Stat(ctx context.Context, name string) (Attrs, error) {
	if err := ValidateName(name); err != nil {
		return Attrs{}, err
	}
	p, err := a.client.NewBlobClient(name).GetProperties(ctx, nil)
	if err != nil {
		return Attrs{}, a.mapError(ctx, OpStat, name, Conditions{}, err)
	}
	return propsAttrs(name, p), nil
}

func propsAttrs(name string, p blob.GetPropertiesResponse) Attrs {
	return Attrs{
		Name:     name,
		Size:     deref(p.ContentLength),
		ModTime:  deref(p.LastModified),
		ETag:     quoteETag(p.ETag),
		Metadata: fromAzureMetadata(p.Metadata),
		// Content-MD5 is a blob property; the header of that name
		// on a ranged GET would be the range's.
		ContentMD5: blockBlobMD5(p.BlobType, p.ContentMD5),
	}
}

// blockBlobMD5 is a blob's Content-MD5 as the MD5 of its content: for
// block blobs only. An append or page blob keeps the one it was created
// with while its content changes, so it says nothing about the content.
func blockBlobMD5(typ *blob.BlobType, sum []byte) []byte {
	if typ != nil && *typ != blob.BlobTypeBlockBlob {
		return nil
	}
	return sum
}

// ReadAt implements Store with one ranged GET whose body is read whole into
// p.
func (a *Azure) ReadAt(ctx context.Context, name string, p []byte, off int64, etag string) (int, error) {
	if err := ValidateName(name); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, fmt.Errorf("azure: read %q: negative offset %d", name, off)
	}
	if len(p) == 0 {
		return 0, nil
	}
	opts := &blob.DownloadStreamOptions{Range: blob.HTTPRange{Offset: off, Count: int64(len(p))}}
	cond := Conditions{IfMatch: etag}
	opts.AccessConditions = accessConditions(cond)
	resp, err := a.client.NewBlobClient(name).DownloadStream(ctx, opts)
	if err != nil {
		// A range that starts at or past the end is 416 (an empty blob
		// has no satisfiable range at all): that is end of file. The
		// service evaluates If-Match before the range, so a changed blob
		// still reports ErrPreconditionFailed.
		var re *azcore.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusRequestedRangeNotSatisfiable {
			return 0, io.EOF
		}
		return 0, a.mapError(ctx, OpReadAt, name, cond, err)
	}
	defer resp.Body.Close()
	want := len(p)
	if resp.ContentLength != nil && *resp.ContentLength < int64(want) {
		want = int(*resp.ContentLength)
	}
	n, err := io.ReadFull(resp.Body, p[:want])
	if err != nil {
		// The body broke off (connection reset, per-try timeout): a
		// short read here is not end of file.
		return n, a.mapError(ctx, OpReadAt, name, cond, err)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// List implements Store: one page of ListBlobsHierarchy (with a delimiter)
// or ListBlobsFlat, with metadata.
func (a *Azure) List(ctx context.Context, opts ListOptions) (ListPage, error) {
	if opts.MaxResults < 0 {
		return ListPage{}, fmt.Errorf("azure: list %q: negative MaxResults %d", opts.Prefix, opts.MaxResults)
	}
	var (
		include    = container.ListBlobsInclude{Metadata: true}
		prefix     = optString(opts.Prefix)
		marker     = optString(opts.Marker)
		maxResults *int32
		page       ListPage
		items      []*container.BlobItem
		next       *string
	)
	if opts.MaxResults > 0 {
		maxResults = ptr(int32(min(opts.MaxResults, MaxListResults)))
	}
	if opts.Delimiter != "" {
		pager := a.client.NewListBlobsHierarchyPager(opts.Delimiter, &container.ListBlobsHierarchyOptions{
			Include: include, Prefix: prefix, Marker: marker, MaxResults: maxResults,
		})
		resp, err := pager.NextPage(ctx)
		if err != nil {
			return ListPage{}, a.mapError(ctx, OpList, opts.Prefix, Conditions{}, err)
		}
		if s := resp.Segment; s != nil {
			items = s.BlobItems
			for _, bp := range s.BlobPrefixes {
				if bp != nil && bp.Name != nil {
					page.Prefixes = append(page.Prefixes, *bp.Name)
				}
			}
		}
		next = resp.NextMarker
	} else {
		pager := a.client.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{
			Include: include, Prefix: prefix, Marker: marker, MaxResults: maxResults,
		})
		resp, err := pager.NextPage(ctx)
		if err != nil {
			return ListPage{}, a.mapError(ctx, OpList, opts.Prefix, Conditions{}, err)
		}
		if resp.Segment != nil {
			items = resp.Segment.BlobItems
		}
		next = resp.NextMarker
	}
	for _, it := range items {
		if it == nil || it.Name == nil {
			continue
		}
		at := Attrs{Name: *it.Name, Metadata: fromAzureMetadata(it.Metadata)}
		if pr := it.Properties; pr != nil {
			at.Size = deref(pr.ContentLength)
			at.ModTime = deref(pr.LastModified)
			at.ETag = quoteETag(pr.ETag)
			at.ContentMD5 = blockBlobMD5(pr.BlobType, pr.ContentMD5)
		}
		page.Blobs = append(page.Blobs, at)
	}
	page.NextMarker = deref(next)
	return page, nil
}

// Put implements Store with one Put Blob request.
func (a *Azure) Put(ctx context.Context, name string, data []byte, opts PutOptions) (Attrs, error) {
	if err := checkWrite(name, opts); err != nil {
		return Attrs{}, err
	}
	resp, err := a.client.NewBlockBlobClient(name).Upload(ctx, streaming.NopCloser(bytes.NewReader(data)), &blockblob.UploadOptions{
		Metadata:                toAzureMetadata(opts.Metadata),
		AccessConditions:        accessConditions(opts.Conditions),
		TransactionalValidation: contentMD5(data),
	})
	if err != nil {
		return Attrs{}, a.mapError(ctx, OpPut, name, opts.Conditions, err)
	}
	return Attrs{
		Name:     name,
		Size:     int64(len(data)),
		ModTime:  deref(resp.LastModified),
		ETag:     quoteETag(resp.ETag),
		Metadata: lowerKeys(opts.Metadata),
		// The service keeps the body's MD5, which it checked.
		ContentMD5: resp.ContentMD5,
	}, nil
}

// StageBlock implements Store with Put Block. Block ids are passed to the
// service unchanged: they are base64 already (validateBlockID).
func (a *Azure) StageBlock(ctx context.Context, name, blockID string, data []byte) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if err := validateBlockID(blockID); err != nil {
		return err
	}
	var validation blob.TransferValidationType
	if sum, ok := BlockMD5(ctx, data); ok {
		validation = blob.TransferValidationTypeMD5(sum)
	} else {
		validation = contentMD5(data)
	}
	_, err := a.client.NewBlockBlobClient(name).StageBlock(ctx, blockID, streaming.NopCloser(bytes.NewReader(data)), &blockblob.StageBlockOptions{
		TransactionalValidation: validation,
	})
	return a.mapError(ctx, OpStageBlock, name, Conditions{}, err)
}

// ChecksBlockMD5 implements BlockMD5Checker: every StageBlock sends its
// block's Content-MD5.
func (a *Azure) ChecksBlockMD5() bool { return true }

// contentMD5 is the Content-MD5 of a request body: the service checks it
// against what it received and refuses the request (Md5Mismatch, which is
// retried) when a byte changed on the way, as rclone, azcopy --put-md5 and
// blobfuse2's validate-md5 do. For a Put Blob it is also kept as the
// blob's Content-MD5.
func contentMD5(data []byte) blob.TransferValidationType {
	sum := md5.Sum(data)
	return blob.TransferValidationTypeMD5(sum[:])
}

// CommitBlocks implements Store with Put Block List, followed by a Get Blob
// Properties for the size, which Put Block List does not return. In the
// rare race where another writer replaces the blob between the two, the
// returned Size is -1 (unknown); see attrsAfterCommit.
func (a *Azure) CommitBlocks(ctx context.Context, name string, blockIDs []string, opts PutOptions) (Attrs, error) {
	if err := checkWrite(name, opts); err != nil {
		return Attrs{}, err
	}
	if len(blockIDs) > MaxBlocks {
		return Attrs{}, fmt.Errorf("azure: commit %q: %d blocks, more than %d", name, len(blockIDs), MaxBlocks)
	}
	for _, id := range blockIDs {
		if err := validateBlockID(id); err != nil {
			return Attrs{}, err
		}
	}
	var headers *blob.HTTPHeaders
	if len(opts.ContentMD5) > 0 {
		// x-ms-blob-content-md5: the service does not check it (it
		// has no MD5 of the whole), it keeps it for readers.
		headers = &blob.HTTPHeaders{BlobContentMD5: opts.ContentMD5}
	}
	resp, err := a.client.NewBlockBlobClient(name).CommitBlockList(ctx, blockIDs, &blockblob.CommitBlockListOptions{
		Metadata:         toAzureMetadata(opts.Metadata),
		AccessConditions: accessConditions(opts.Conditions),
		HTTPHeaders:      headers,
	})
	if err != nil {
		return Attrs{}, a.mapError(ctx, OpCommitBlocks, name, opts.Conditions, err)
	}
	return a.attrsAfterCommit(ctx, name, Attrs{
		Name:       name,
		Size:       -1,
		ModTime:    deref(resp.LastModified),
		ETag:       quoteETag(resp.ETag),
		Metadata:   lowerKeys(opts.Metadata),
		ContentMD5: opts.ContentMD5,
	})
}

// attrsAfterCommit completes the attributes of a blob just written (whose
// size the write response lacks) with a Get Blob Properties conditional on
// the write's ETag. If another writer replaced the blob in between, it
// returns the committed version's attributes with Size -1 (unknown) rather
// than the newer blob's: the ETag must stay the one this write produced,
// or a later conditional write would silently overwrite the other writer.
func (a *Azure) attrsAfterCommit(ctx context.Context, name string, committed Attrs) (Attrs, error) {
	p, err := a.client.NewBlobClient(name).GetProperties(ctx, &blob.GetPropertiesOptions{
		AccessConditions: accessConditions(Conditions{IfMatch: committed.ETag}),
	})
	if err != nil {
		// Replaced meanwhile (412), deleted (404), or the read failed:
		// the write itself succeeded, and failing now would make a
		// retry layer repeat a commit whose staged blocks are gone.
		return committed, nil
	}
	return propsAttrs(name, p), nil
}

// Delete implements Store; the blob's snapshots go with it (the service
// refuses to delete a blob that has snapshots otherwise).
func (a *Azure) Delete(ctx context.Context, name string, cond Conditions) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if err := checkConditions(cond); err != nil {
		return err
	}
	_, err := a.client.NewBlobClient(name).Delete(ctx, &blob.DeleteOptions{
		DeleteSnapshots:  ptr(blob.DeleteSnapshotsOptionTypeInclude),
		AccessConditions: accessConditions(cond),
	})
	return a.mapError(ctx, OpDelete, name, cond, err)
}

// Copy implements Store with Copy Blob within the container, then polls
// until the copy has finished.
func (a *Azure) Copy(ctx context.Context, dst, src string) (Attrs, error) {
	if err := ValidateName(src); err != nil {
		return Attrs{}, err
	}
	if err := ValidateName(dst); err != nil {
		return Attrs{}, err
	}
	// The source URL carries the SAS token, if any; with a shared key the
	// service authorizes a same-account source with the request's own
	// credentials.
	srcURL := a.client.NewBlobClient(src).URL()
	dstClient := a.client.NewBlobClient(dst)
	resp, err := dstClient.StartCopyFromURL(ctx, srcURL, nil)
	if err != nil {
		return Attrs{}, a.mapError(ctx, OpCopy, src+" -> "+dst, Conditions{}, err)
	}
	copyID := deref(resp.CopyID)
	status := deref(resp.CopyStatus)

	deadline := time.Now().Add(copyPollLimit)
	interval := copyPollFirst
	for {
		p, err := dstClient.GetProperties(ctx, nil)
		if err != nil {
			return Attrs{}, a.mapError(ctx, OpCopy, src+" -> "+dst, Conditions{}, err)
		}
		if id := deref(p.CopyID); id != "" && copyID != "" && id != copyID {
			// Another writer replaced dst (or started its own copy):
			// ours is no longer observable.
			return Attrs{}, fmt.Errorf("azure: copy %q -> %q: the destination was replaced by another copy while copying: %w", src, dst, ErrPreconditionFailed)
		}
		if p.CopyStatus != nil {
			status = *p.CopyStatus
		}
		switch status {
		case blob.CopyStatusTypeSuccess, "":
			// "" : the service no longer reports copy state (dst
			// overwritten by a plain write) or copied synchronously.
			return propsAttrs(dst, p), nil
		case blob.CopyStatusTypeFailed:
			return Attrs{}, RedactError(fmt.Errorf("azure: copy %q -> %q failed: %s: %w", src, dst, deref(p.CopyStatusDescription), ErrTransient))
		case blob.CopyStatusTypeAborted:
			return Attrs{}, RedactError(fmt.Errorf("azure: copy %q -> %q was aborted: %s", src, dst, deref(p.CopyStatusDescription)))
		}
		if time.Now().After(deadline) {
			a.abortCopy(ctx, dstClient, copyID)
			return Attrs{}, fmt.Errorf("azure: copy %q -> %q still pending after %v; aborted it: %w", src, dst, copyPollLimit, ErrTransient)
		}
		select {
		case <-ctx.Done():
			a.abortCopy(ctx, dstClient, copyID)
			return Attrs{}, fmt.Errorf("azure: copy %q -> %q: %w", src, dst, ctx.Err())
		case <-time.After(interval):
		}
		interval = min(2*interval, copyPollMax)
	}
}

// abortCopy stops a pending copy that nobody waits for any more, so that it
// does not land later over a destination the caller thinks unchanged. Best
// effort: it runs after ctx ended, bounded by its own short timeout.
func (a *Azure) abortCopy(ctx context.Context, c *blob.Client, copyID string) {
	if copyID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, _ = c.AbortCopyFromURL(ctx, copyID, nil)
}

// SetMetadata implements Store with Set Blob Metadata. Unless the caller
// gives a condition, it reads the blob's properties first and makes the
// update conditional on them, so that the size it returns belongs to the
// ETag it returns (the service's answer has no size).
func (a *Azure) SetMetadata(ctx context.Context, name string, md map[string]string, cond Conditions) (Attrs, error) {
	if err := checkWrite(name, PutOptions{Metadata: md, Conditions: cond}); err != nil {
		return Attrs{}, err
	}
	c := a.client.NewBlobClient(name)
	const attempts = 3 // other writers racing on one blob; then give up
	for i := 0; ; i++ {
		var before blob.GetPropertiesResponse
		useCond := cond
		if !cond.IfNoneMatch {
			var err error
			before, err = c.GetProperties(ctx, &blob.GetPropertiesOptions{AccessConditions: accessConditions(cond)})
			if err != nil {
				return Attrs{}, a.mapError(ctx, OpSetMetadata, name, cond, err)
			}
			useCond.IfMatch = string(deref(before.ETag))
		}
		resp, err := c.SetMetadata(ctx, toAzureMetadata(md), &blob.SetMetadataOptions{AccessConditions: accessConditions(useCond)})
		if err == nil {
			at := propsAttrs(name, before)
			at.ETag = quoteETag(resp.ETag)
			at.ModTime = deref(resp.LastModified)
			at.Metadata = lowerKeys(md)
			return at, nil
		}
		err = a.mapError(ctx, OpSetMetadata, name, cond, err)
		// Our own If-Match failed: the blob changed between the two
		// requests. Only the caller's condition may fail the call.
		if cond.IfMatch != "" || !errors.Is(err, ErrPreconditionFailed) || i+1 == attempts {
			return Attrs{}, err
		}
	}
}

// Check implements Store by listing one blob: the least a mount needs, and a
// request that every credential able to mount may make (a container SAS
// cannot read container properties). Errors become sentences that say what
// to fix.
func (a *Azure) Check(ctx context.Context) error {
	_, err := a.List(ctx, ListOptions{MaxResults: 1})
	if err == nil {
		return nil
	}
	where := fmt.Sprintf("container %q at %s", a.target.container, a.target.serviceURL)
	var ae *azureError
	isResp := errors.As(err, &ae) && ae.status != 0
	// Azure says AuthenticationFailed to a bad signature, Azurite
	// AuthorizationFailure; both open their message with this.
	badSignature := isResp && (ae.code == string(bloberror.AuthenticationFailed) ||
		strings.HasPrefix(ae.msg, "Server failed to authenticate the request"))
	var dnsErr *net.DNSError
	var tokErr *tokenError
	switch {
	case errors.As(err, &tokErr):
		return fmt.Errorf("azure: %s: could not get an Azure AD token (configure a managed identity, workload identity, a service principal in AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET, or `az login`): %w", where, err)
	case errors.Is(err, ErrNotFound) && a.target.mode == AzureAuthAnonymous:
		return fmt.Errorf("azure: %s: container not found or not public (anonymous access needs public access level \"container\"): %w", where, err)
	case errors.Is(err, ErrNotFound) && isResp && ae.code != string(bloberror.ContainerNotFound):
		// Not the container: the service did not find the account. Real
		// Azure fails on DNS for an unknown account; an emulator serves
		// accounts under paths and answers ResourceNotFound.
		if u, perr := url.Parse(a.target.serviceURL); perr == nil && strings.Trim(u.Path, "/") == "" {
			return fmt.Errorf("azure: %s: the endpoint has no account in its path; an emulator serves each account under its own path, e.g. %s://%s/devstoreaccount1: %w", where, u.Scheme, u.Host, err)
		}
		return fmt.Errorf("azure: %s: no such account at this endpoint (the service answered %s, not ContainerNotFound): check the account name and the endpoint: %w", where, ae.code, err)
	case errors.Is(err, ErrNotFound):
		return fmt.Errorf("azure: %s: the container does not exist in this account: %w", where, err)
	case errors.Is(err, ErrUnauthorized) && a.target.mode == AzureAuthAnonymous:
		return fmt.Errorf("azure: %s: anonymous access denied: the container is not public: %w", where, err)
	case errors.Is(err, ErrUnauthorized) && isResp && !ae.sasExpired.IsZero():
		return fmt.Errorf("azure: %s: authentication failed: renew the SAS token: %w", where, err)
	case errors.Is(err, ErrUnauthorized) && badSignature:
		return fmt.Errorf("azure: %s: authentication failed: %s: %w", where, a.credentialHint(), err)
	case errors.Is(err, ErrUnauthorized):
		return fmt.Errorf("azure: %s: access denied: the credentials may not list this container (%s): %w", where, a.permissionHint(), err)
	case errors.As(err, &dnsErr):
		return fmt.Errorf("azure: %s: cannot resolve host %q (is the account name or endpoint right?): %w", where, dnsErr.Name, err)
	case !isResp && errors.Is(err, ErrTransient):
		return fmt.Errorf("azure: %s: cannot reach the blob endpoint: %w", where, err)
	}
	return fmt.Errorf("azure: %s: %w", where, err)
}

func (a *Azure) credentialHint() string {
	switch a.target.mode {
	case AzureAuthKey:
		return "the account key is wrong or belongs to another account"
	case AzureAuthSAS:
		return "the SAS token is invalid, expired, or signed with a rotated key"
	case AzureAuthConnString:
		return "the key or SAS in the connection string is wrong, expired, or for another account"
	}
	return "the credentials were rejected"
}

func (a *Azure) permissionHint() string {
	switch a.target.mode {
	case AzureAuthAzureAD:
		return "assign the identity a data role such as Storage Blob Data Contributor on the container or account"
	case AzureAuthSAS, AzureAuthConnString:
		return "the SAS needs read and list permission (sp=rl or more) on this container, and this client's IP must be allowed"
	}
	return "check the storage account's network rules and permissions"
}

// CreateContainer creates cfg.Container with the given metadata. It is
// idempotent: a container that already exists is success.
func CreateContainer(ctx context.Context, cfg AzureConfig, metadata map[string]string) error {
	if err := ValidateMetadata(metadata); err != nil {
		return err
	}
	a, err := NewAzure(cfg)
	if err != nil {
		return err
	}
	defer a.hc.CloseIdleConnections() // a one-shot client: no pool to keep
	_, err = a.client.Create(ctx, &container.CreateOptions{Metadata: toAzureMetadata(metadata)})
	if err = a.mapError(ctx, "CreateContainer", cfg.Container, Conditions{}, err); errors.Is(err, ErrAlreadyExists) {
		return nil
	}
	return err
}

// DeleteContainer deletes cfg.Container and every blob in it. It is
// idempotent: a container that does not exist is success.
func DeleteContainer(ctx context.Context, cfg AzureConfig) error {
	a, err := NewAzure(cfg)
	if err != nil {
		return err
	}
	defer a.hc.CloseIdleConnections()
	_, err = a.client.Delete(ctx, nil)
	if err = a.mapError(ctx, "DeleteContainer", cfg.Container, Conditions{}, err); errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// azureError is what every Azure call fails with: the operation and blob,
// the sentinel (Kind, nil when none fits) and the SDK's error, both
// reachable with errors.Is/As. Its message is one line; the SDK's full
// error (request, response headers) stays available through errors.As for
// *azcore.ResponseError.
type azureError struct {
	op     string
	name   string
	kind   error // one of the sentinels, or nil
	status int   // HTTP status, 0 when there was no response
	code   string
	msg    string // first line of the service's error message
	// retryAfter is the wait the service asked for (429/503), or 0.
	retryAfter time.Duration
	// tryTimeout is set when the try ran out of its per-try timeout
	// (AzureConfig.TryTimeout) without a complete answer.
	tryTimeout time.Duration
	// sasExpired is set when the service refused the credentials and
	// they are a SAS token that expired then.
	sasExpired time.Time
	err        error
}

// RetryAfter implements RetryAfterer, so that NewRetrying honours the
// service's Retry-After when it throttles.
func (e *azureError) RetryAfter() time.Duration { return e.retryAfter }

func (e *azureError) Error() string {
	return Redact(e.message())
}

func (e *azureError) message() string {
	var b strings.Builder
	fmt.Fprintf(&b, "azure: %s %q: ", e.op, e.name)
	if e.kind != nil {
		b.WriteString(e.kind.Error())
		b.WriteString(": ")
	}
	if !e.sasExpired.IsZero() {
		fmt.Fprintf(&b, "the SAS token expired at %s: ", e.sasExpired.Format(time.RFC3339))
	}
	if e.status != 0 {
		fmt.Fprintf(&b, "HTTP %d", e.status)
		if e.code != "" {
			fmt.Fprintf(&b, " %s", e.code)
		}
		if e.msg != "" {
			fmt.Fprintf(&b, " (%s)", e.msg)
		}
	} else {
		if e.tryTimeout > 0 {
			fmt.Fprintf(&b, "no complete answer within %v (the per-request timeout): ", e.tryTimeout)
		}
		b.WriteString(e.err.Error())
	}
	return b.String()
}

func (e *azureError) Unwrap() []error {
	if e.kind == nil {
		return []error{e.err}
	}
	return []error{e.kind, e.err}
}

// mapError maps an SDK error (mapAzureError) and adds what only the store
// knows: a try that ran out of time ran out of a's per-try timeout, and
// credentials refused while a's SAS token is past its expiry were refused
// because of it (Azure answers 403 AuthenticationFailed, Azurite 403
// AuthorizationFailure, neither saying why).
func (a *Azure) mapError(ctx context.Context, op Op, name string, cond Conditions, err error) error {
	err = mapAzureError(ctx, op, name, cond, err)
	var e *azureError
	if !errors.As(err, &e) {
		return err
	}
	if e.status == 0 && errors.Is(e.kind, ErrTransient) && errors.Is(e.err, context.DeadlineExceeded) {
		// The caller's context is live (mapAzureError checked): the
		// deadline was the SDK's per-try one.
		e.tryTimeout = a.target.tryTimeout
	}
	if exp := a.target.sasExpiry; e.status != 0 && errors.Is(e.kind, ErrUnauthorized) && !exp.IsZero() && time.Now().After(exp) {
		e.sasExpired = exp
	}
	return err
}

// mapAzureError is the one place where SDK errors become blobstore
// errors. cond is the request's condition: the service answers a failed
// If-None-Match:* with 409 BlobAlreadyExists, but a plain HTTP 412 to it
// (as emulators may send) means the same thing.
func mapAzureError(ctx context.Context, op Op, name string, cond Conditions, err error) error {
	if err == nil {
		return nil
	}
	redactURLErrors(err)
	e := &azureError{op: string(op), name: name, err: err}
	var re *azcore.ResponseError
	var tokErr *tokenError
	var certErr *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var refused *refusedEndpointError
	switch {
	case errors.As(err, &re):
		e.status, e.code = re.StatusCode, re.ErrorCode
		e.msg = serviceMessage(re)
		e.kind = azureStatusKind(re.StatusCode, bloberror.Code(re.ErrorCode))
		if e.kind == ErrThrottled {
			e.retryAfter = retryAfter(re.RawResponse, time.Now())
		}
		if cond.IfNoneMatch && e.kind == ErrPreconditionFailed {
			e.kind = ErrAlreadyExists
		}
	case ctx.Err() != nil:
		// The caller gave up: neither the store's fault nor worth a
		// retry. errors.Is(err, context.Canceled) holds through e.err
		// or, when the SDK reported something else, through this.
		if !errors.Is(err, ctx.Err()) {
			e.err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
	case errors.As(err, &tokErr):
		// No token: no managed identity here, `az login` missing, or
		// the identity provider refused. The credential types retry
		// their own transient failures.
		e.kind = ErrUnauthorized
	case errors.As(err, &certErr), errors.As(err, &unknownCA), errors.As(err, &hostErr), errors.As(err, &refused):
		// A TLS trust problem, or an endpoint whose host resolves where
		// blob requests never go (guardDial), is configuration:
		// retries won't fix it.
	default:
		// Per-try timeouts, refused or reset connections, a body cut
		// short, DNS failures.
		e.kind = ErrTransient
	}
	return e
}

// azureStatusKind maps an HTTP status and service error code to a
// sentinel.
func azureStatusKind(status int, code bloberror.Code) error {
	switch {
	case status == http.StatusNotFound:
		return ErrNotFound
	case status == http.StatusPreconditionFailed:
		return ErrPreconditionFailed
	case code == bloberror.BlobAlreadyExists, code == bloberror.ContainerAlreadyExists:
		return ErrAlreadyExists
	case code == bloberror.ContainerBeingDeleted:
		// Re-creating a container shortly after deleting it: wait.
		return ErrTransient
	case status == http.StatusTooManyRequests, status == http.StatusServiceUnavailable:
		return ErrThrottled
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return ErrUnauthorized
	case code == bloberror.InvalidResourceName:
		return ErrInvalidName
	case status == http.StatusRequestTimeout, status >= 500:
		return ErrTransient
	case code == bloberror.MD5Mismatch:
		// The body changed on the way: sending it again may work.
		return ErrTransient
	}
	return nil
}

// retryAfter reads the wait a throttling answer asks for: the storage
// service's millisecond headers first, then HTTP Retry-After (seconds or a
// date). 0 when there is none.
func retryAfter(resp *http.Response, now time.Time) time.Duration {
	if resp == nil {
		return 0
	}
	for _, h := range []string{"x-ms-retry-after-ms", "retry-after-ms"} {
		if ms, err := strconv.ParseInt(resp.Header.Get(h), 10, 64); err == nil && ms > 0 {
			return time.Duration(ms) * time.Millisecond
		}
	}
	v := resp.Header.Get("Retry-After")
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil && secs > 0 {
		return time.Duration(secs) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil && at.After(now) {
		return at.Sub(now)
	}
	return 0
}

// serviceMessage returns the first line of the <Message> of the service's
// XML error body ("Server failed to authenticate the request..."), which
// says more than the code alone; the rest of it is request ids and times.
func serviceMessage(re *azcore.ResponseError) string {
	if re.RawResponse == nil {
		return ""
	}
	body, err := runtime.Payload(re.RawResponse)
	if err != nil || len(body) == 0 {
		return ""
	}
	var doc struct {
		Message string `xml:"Message"`
	}
	if xml.Unmarshal(body, &doc) != nil {
		return ""
	}
	msg, _, _ := strings.Cut(strings.TrimSpace(doc.Message), "\n")
	return strings.TrimSpace(msg)
}

func accessConditions(c Conditions) *blob.AccessConditions {
	if c.IfMatch == "" && !c.IfNoneMatch {
		return nil
	}
	m := &blob.ModifiedAccessConditions{}
	if c.IfMatch != "" {
		m.IfMatch = ptr(azcore.ETag(c.IfMatch))
	}
	if c.IfNoneMatch {
		m.IfNoneMatch = ptr(azcore.ETagAny)
	}
	return &blob.AccessConditions{ModifiedAccessConditions: m}
}

// quoteETag returns the ETag in its quoted header form: listings return
// it unquoted, headers quoted.
func quoteETag(e *azcore.ETag) string {
	s := string(deref(e))
	if s == "" || strings.HasPrefix(s, `"`) || strings.HasPrefix(s, `W/"`) {
		return s
	}
	return `"` + s + `"`
}

func toAzureMetadata(md map[string]string) map[string]*string {
	if len(md) == 0 {
		return nil
	}
	out := make(map[string]*string, len(md))
	for k, v := range md {
		out[k] = ptr(v)
	}
	return out
}

func fromAzureMetadata(md map[string]*string) map[string]string {
	if len(md) == 0 {
		return nil
	}
	out := make(map[string]string, len(md))
	for k, v := range md {
		if v != nil {
			out[strings.ToLower(k)] = *v
		}
	}
	return out
}

// lowerKeys copies md with its keys in lower case, as the service will
// report them.
func lowerKeys(md map[string]string) map[string]string {
	if len(md) == 0 {
		return nil
	}
	out := make(map[string]string, len(md))
	for k, v := range md {
		out[strings.ToLower(k)] = v
	}
	return out
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func ptr[T any](v T) *T { return &v }

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
