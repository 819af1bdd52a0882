package buildkit

import (
	"context"
	"errors"
	"fmt"
	"testing"

	gatewaypb "github.com/moby/buildkit/frontend/gateway/pb"
	"github.com/moby/buildkit/util/grpcerrors"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestBuildFailed: a step's process that exited non-zero, as the client
// decodes it from the daemon's gRPC status, is the build's failure; a
// daemon that is gone or lost the process is not.
func TestBuildFailed(t *testing.T) {
	overWire := func(err error) error { return grpcerrors.FromGRPC(grpcerrors.ToGRPC(context.Background(), err)) }
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"a compile error", &StepError{Name: "go build", Err: overWire(&gatewaypb.ExitError{ExitCode: 1, Err: errors.New("process did not complete successfully")})}, true},
		{"wrapped", fmt.Errorf("antrea-agent: %w", overWire(&gatewaypb.ExitError{ExitCode: 2})), true},
		{"an unknown exit status", overWire(&gatewaypb.ExitError{ExitCode: gatewaypb.UnknownExitStatus}), false},
		{"killed (out of memory)", overWire(&gatewaypb.ExitError{ExitCode: 137}), false},
		{"a daemon gone", status.Error(codes.Unavailable, "connection refused"), false},
		{"a plain error", errors.New("exit code: 1"), false},
	} {
		if got := BuildFailed(tt.err); got != tt.want {
			t.Errorf("%s: BuildFailed(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}
