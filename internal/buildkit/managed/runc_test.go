package managed

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

func TestMissingRuncAsRootIsNotInstalledUnasked(t *testing.T) {
	defer func(l func(string) (string, error), e func() int) { lookPath, geteuid = l, e }(lookPath, geteuid)
	lookPath = func(name string) (string, error) {
		if name == "apt-get" {
			t.Fatal("kiln looked for apt-get without being asked to install")
		}
		return "", errors.New("not found")
	}
	geteuid = func() int { return 0 }
	t.Setenv(InstallEnv, "")
	err := ensureRunc(context.Background())
	if err == nil || !strings.Contains(err.Error(), "apt-get install -y runc") || !strings.Contains(err.Error(), "buildkit:setup") {
		t.Errorf("error %v; want the command and the opt-in", err)
	}
}
