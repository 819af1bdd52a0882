package buildkit

import (
	"strings"
	"testing"
)

func TestRegistryHostIsTheHostTheUserGave(t *testing.T) {
	for _, tc := range []struct {
		in, want  string
		plainHTTP bool
	}{
		{"127.0.0.1:5000", "127.0.0.1:5000", true},
		{"localhost:5000/team", "localhost:5000/team", true},
		{"registry.example.com/antrea", "registry.example.com/antrea", false},
		{"buildhost:5000", "buildhost:5000", false},
	} {
		got, plain, err := RegistryHost(tc.in)
		if err != nil || got != tc.want || plain != tc.plainHTTP {
			t.Errorf("RegistryHost(%q) = %q, %t, %v; want %q, %t", tc.in, got, plain, err, tc.want, tc.plainHTTP)
		}
	}
	for _, bad := range []string{"buildhost", "buildhost/team", "Not A Registry"} {
		if _, _, err := RegistryHost(bad); err == nil {
			t.Errorf("RegistryHost(%q) was accepted", bad)
		} else if bad == "buildhost" && !strings.Contains(err.Error(), "docker.io") {
			t.Errorf("RegistryHost(%q): %v; want it to say it would go to docker.io", bad, err)
		}
	}
}

func TestRegistryOfReadsTheHostAsTheReferenceGrammarDoes(t *testing.T) {
	for ref, want := range map[string]string{
		"192.0.2.2:46045/antrea":                   "192.0.2.2:46045",
		"registry.example/antrea/base:1@sha256:ab": "registry.example",
		"localhost/x":                              "localhost",
		"busybox:1":                                "docker.io",
		"library/busybox":                          "docker.io",
	} {
		if got := RegistryOf(ref); got != want {
			t.Errorf("RegistryOf(%q) = %q, want %q", ref, got, want)
		}
	}
}
