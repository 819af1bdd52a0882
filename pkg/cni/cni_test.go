package cni

import (
	"bytes"
	"encoding/json"
	"testing"
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
	var res versionResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if res.CNIVersion != "1.1.0" || len(res.SupportedVersions) != len(SupportedVersions) {
		t.Errorf("unexpected VERSION result %+v", res)
	}
}

func TestOtherCommandsAreCNIErrors(t *testing.T) {
	for _, cmd := range []string{"ADD", "DEL", "CHECK", ""} {
		var out bytes.Buffer
		if code := Main(nil, env(cmd), &out); code == 0 {
			t.Errorf("%q: exit 0, want non-zero", cmd)
		}
		var e cniError
		if err := json.Unmarshal(out.Bytes(), &e); err != nil || e.Code != errInvalidEnvironment || e.Msg == "" {
			t.Errorf("%q: not a CNI error: %s", cmd, out.String())
		}
	}
}
