package session

import (
	"strings"
	"testing"
)

// TestProgressModeComesFromTheFlagThenKilnThenBuildKit: -progress wins,
// then KILN_PROGRESS, then BUILDKIT_PROGRESS as buildx reads it; a wrong
// mode names where it came from.
func TestProgressModeComesFromTheFlagThenKilnThenBuildKit(t *testing.T) {
	for _, tc := range []struct{ flag, kiln, buildkit, want, err string }{
		{"", "", "", "auto", ""},
		{"", "", "plain", "plain", ""},
		{"", "quiet", "plain", "quiet", ""},
		{"tty", "quiet", "plain", "tty", ""},
		{"", "", "fancy", "", "BUILDKIT_PROGRESS: progress mode \"fancy\""},
		{"", "fancy", "plain", "", "KILN_PROGRESS: progress mode \"fancy\""},
	} {
		t.Setenv("KILN_PROGRESS", tc.kiln)
		t.Setenv("BUILDKIT_PROGRESS", tc.buildkit)
		o := Options{Progress: tc.flag}
		got, err := o.ProgressMode()
		if got != tc.want || (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%+v: %q, %v", tc, got, err)
		}
	}
}
