package buildkit

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestMissingRuncWithoutRootNamesTheFix(t *testing.T) {
	defer func(l func(string) (string, error), e func() int) { lookPath, geteuid = l, e }(lookPath, geteuid)
	lookPath = func(string) (string, error) { return "", errors.New("not found") }
	geteuid = func() int { return 1000 }
	err := ensureRunc(context.Background())
	if err == nil {
		t.Fatal("a missing runc was accepted")
	}
	for _, want := range []string{"runc not found in PATH", "apt-get install -y runc"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
