package publish

import (
	"errors"
	"strings"
	"testing"
)

func TestExplainPush(t *testing.T) {
	tests := []struct{ msg, want string }{
		{`failed to do request: Head "http://127.0.0.1:40137/v2/x": dial tcp 127.0.0.1:40137: connect: connection refused`, "unreachable"},
		{`unexpected status from HEAD request to http://127.0.0.1:5000/v2/x: 401 Unauthorized`, "refused the credentials"},
		{`failed to authorize: failed to fetch basic auth token: 401 Unauthorized`, "refused the credentials"},
		{`something else at 127.0.0.1:14010 sha256:401abc`, "push to"},
	}
	for _, tt := range tests {
		got := explainPush(errors.New(tt.msg), "127.0.0.1:40137").Error()
		if !strings.Contains(got, tt.want) {
			t.Errorf("%q explained as %q, want %q", tt.msg, got, tt.want)
		}
		if tt.want == "push to" && (strings.Contains(got, "unreachable") || strings.Contains(got, "credentials")) {
			t.Errorf("%q misread: %q", tt.msg, got)
		}
	}
}
