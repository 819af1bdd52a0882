package cni

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	cniversion "github.com/containernetworking/cni/pkg/version"
)

func env(cmd string) func(string) string {
	return func(k string) string {
		if k == "CNI_COMMAND" {
			return cmd
		}
		return ""
	}
}

func TestVersionCommand(t *testing.T) {
	var out bytes.Buffer
	if code := Main(nil, env("VERSION"), &out); code != 0 {
		t.Fatalf("exit %d", code)
	}
	// Decoded by the CNI library, as a container runtime would.
	info, err := (&cniversion.PluginDecoder{}).Decode(out.Bytes())
	if err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if got := info.SupportedVersions(); len(got) != len(SupportedVersions) || got[len(got)-1] != "1.1.0" {
		t.Errorf("unexpected VERSION result %v", got)
	}
}

func TestOtherCommandsAreCNIErrors(t *testing.T) {
	for _, cmd := range []string{"ADD", "DEL", "CHECK", ""} {
		var out bytes.Buffer
		if code := Main(nil, env(cmd), &out); code == 0 {
			t.Errorf("%q: exit 0, want non-zero", cmd)
		}
		var e types.Error
		if err := json.Unmarshal(out.Bytes(), &e); err != nil || e.Code != types.ErrInvalidEnvironmentVariables || e.Msg == "" {
			t.Errorf("%q: not a CNI error: %s", cmd, out.String())
		}
	}
}
