package csi

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/blobfs/blobfs/blobstore"
)

// invalid is an InvalidArgument status; messages name the field.
func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// storeError maps a store or mount failure to a gRPC status, once, from
// blobstore's sentinels. what says what was being done.
func storeError(what string, err error) error {
	if _, ok := status.FromError(err); ok && status.Code(err) != codes.Unknown {
		return err
	}
	msg := fmt.Sprintf("%s: %v", what, err)
	code := codes.Internal
	var symlink *symlinkError
	switch {
	case errors.As(err, &symlink):
		// A path swapped for a symlink between the request's check
		// and the mount: refused like one found at the check.
		return invalid("%v", symlink)
	case errors.Is(err, blobstore.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, blobstore.ErrUnauthorized):
		code = codes.PermissionDenied
	case errors.Is(err, blobstore.ErrThrottled), errors.Is(err, blobstore.ErrTransient):
		code = codes.Unavailable
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, ErrSecretNotFound):
		code = codes.FailedPrecondition
	}
	return status.Error(code, msg)
}

// pathError maps a failure to open or create a staging or target
// directory: a symlink there is the request's fault.
func pathError(err error) error {
	if _, ok := status.FromError(err); ok && status.Code(err) != codes.Unknown {
		return err
	}
	var symlink *symlinkError
	if errors.As(err, &symlink) {
		return invalid("%v", symlink)
	}
	var notDir *notDirError
	if errors.As(err, &notDir) {
		return invalid("%v", notDir)
	}
	return status.Errorf(codes.Internal, "%v", err)
}

// busy is the answer when another operation holds the volume.
func busy(volumeID string) error {
	return status.Errorf(codes.Aborted, "an operation on volume %q is already in progress", clip(volumeID, 200))
}

// redactStatus returns err as a gRPC status whose message has passed
// through blobstore.Redact. Store errors are redacted where blobstore makes
// them; this catches a secret that reached a message any other way.
func redactStatus(err error) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	if msg := blobstore.Redact(st.Message()); msg != st.Message() {
		return status.Error(st.Code(), msg)
	}
	return err
}
