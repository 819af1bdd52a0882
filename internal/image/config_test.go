package image

import (
	"slices"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/plan"
)

func TestConfigCarriesTheImageAndThePlanFacts(t *testing.T) {
	p := &plan.Plan{SourceDateEpoch: 1700000000, Revision: "abc123", Source: "https://example.com/r", Stamp: plan.Stamp{Version: "v1.0.0"}}
	img := plan.Image{Name: "agent", Image: config.Image{
		Binaries: []string{"agent"}, Entrypoint: []string{"/usr/local/bin/agent"}, Args: []string{"--x"},
		Env: map[string]string{"B": "2", "A": "1"}, User: "65532:65532", Workdir: "/",
		Labels: map[string]string{"org.opencontainers.image.title": "agent"},
	}}
	arm := ocispec.Platform{OS: "linux", Architecture: "arm", Variant: "v7"}
	c := Config(p, img, arm)
	if want := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "A=1", "B=2"}; !slices.Equal(c.Config.Env, want) {
		t.Errorf("env %q, want %q (sorted after PATH)", c.Config.Env, want)
	}
	for k, want := range map[string]string{
		ocispec.AnnotationCreated: "2023-11-14T22:13:20Z", ocispec.AnnotationRevision: "abc123",
		ocispec.AnnotationVersion: "v1.0.0", ocispec.AnnotationSource: "https://example.com/r",
		"org.opencontainers.image.title": "agent",
	} {
		if c.Config.Labels[k] != want {
			t.Errorf("label %s=%q, want %q", k, c.Config.Labels[k], want)
		}
	}
	if c.Platform.Variant != "v7" || c.Config.User != "65532:65532" || !slices.Equal(c.Config.Cmd, []string{"--x"}) {
		t.Errorf("platform %v, user %q, cmd %q", c.Platform, c.Config.User, c.Config.Cmd)
	}
	if len(c.History) != 1 || c.History[0].CreatedBy != "kiln: assemble agent for linux/arm/v7" || !c.Created.Equal(*c.History[0].Created) {
		t.Errorf("history %+v", c.History)
	}
	p.Revision = ""
	if _, ok := Config(p, img, arm).Config.Labels[ocispec.AnnotationRevision]; ok {
		t.Error("a build outside git still has a revision label")
	}
}
