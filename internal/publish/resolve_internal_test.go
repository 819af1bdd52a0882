package publish

import (
	"strings"
	"testing"
)

// Replacing -o must never delete the manifests, nor may a run read its
// own output.
func TestResolveOutputLiesApartFromItsInput(t *testing.T) {
	for _, tt := range []struct {
		from, out string
		ok        bool
	}{
		{"deploy", "_output/resolved", true},
		{"deploy", "deploy", false},
		{"deploy", "deploy/resolved", false},
		{"deploy/k8s", "deploy", false},
		{"deploy/agent.yaml", "deploy", false},
		{"deploy", "deployments", true},
	} {
		err := outsideEachOther(tt.from, tt.out)
		if (err == nil) != tt.ok || (err != nil && !strings.Contains(err.Error(), "overlap")) {
			t.Errorf("-f %s -o %s: %v", tt.from, tt.out, err)
		}
	}
}
