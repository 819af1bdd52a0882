package cli

import (
	"errors"
	"testing"

	"github.com/sirupsen/logrus"
)

// TestLogLinesArePlain: a warning prints as the message alone, as go and
// buildx print theirs; the level shows under -v; fields follow, in order.
func TestLogLinesArePlain(t *testing.T) {
	e := logrus.WithFields(logrus.Fields{"path": "/x", "error": errors.New("boom")})
	e.Message, e.Level = "first run: building buildkitd v0.34.2 (once; about 2 minutes)\n", logrus.WarnLevel
	for _, tc := range []struct {
		levels bool
		want   string
	}{
		{false, "first run: building buildkitd v0.34.2 (once; about 2 minutes) error=boom path=/x\n"},
		{true, "warning: first run: building buildkitd v0.34.2 (once; about 2 minutes) error=boom path=/x\n"},
	} {
		got, err := PlainFormatter{Levels: tc.levels}.Format(e)
		if err != nil || string(got) != tc.want {
			t.Errorf("Levels %v: %q (%v), want %q", tc.levels, got, err, tc.want)
		}
	}
}
