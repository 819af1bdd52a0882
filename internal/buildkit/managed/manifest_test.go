package managed

import (
	"bytes"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The sample Kubernetes deployment runs the buildkitd kiln pins, with TLS
// from a secret and a volume for its state.
func TestKubernetesManifest(t *testing.T) {
	dt, err := os.ReadFile("../../../build/k8s/buildkitd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	dec := yaml.NewDecoder(bytes.NewReader(dt))
	for {
		var doc struct {
			Kind string
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Image string
							Args  []string
						}
					}
				}
				VolumeClaimTemplates []any `yaml:"volumeClaimTemplates"`
			}
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("build/k8s/buildkitd.yaml: %v", err)
		}
		kinds[doc.Kind] = true
		if doc.Kind != "StatefulSet" {
			continue
		}
		c := doc.Spec.Template.Spec.Containers[0]
		if !strings.HasSuffix(c.Image, ":"+Version) {
			t.Errorf("image %s is not buildkit %s, the version kiln pins", c.Image, Version)
		}
		for _, flag := range []string{"--tlscacert", "--tlscert", "--tlskey", "--config"} {
			if !slices.Contains(c.Args, flag) {
				t.Errorf("buildkitd args %v lack %s", c.Args, flag)
			}
		}
		if len(doc.Spec.VolumeClaimTemplates) == 0 {
			t.Error("the StatefulSet has no volume for its state")
		}
	}
	for _, k := range []string{"StatefulSet", "Service", "ConfigMap"} {
		if !kinds[k] {
			t.Errorf("no %s in the manifest", k)
		}
	}
}
