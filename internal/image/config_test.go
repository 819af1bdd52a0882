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
	c := Config(p, img, arm, nil)
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
	if _, ok := Config(p, img, arm, nil).Config.Labels[ocispec.AnnotationRevision]; ok {
		t.Error("a build outside git still has a revision label")
	}
}

func TestConfigOnABaseKeepsWhatImageYAMLLeavesUnset(t *testing.T) {
	p := &plan.Plan{SourceDateEpoch: 1700000000, Stamp: plan.Stamp{Version: "v1"}}
	base := &ocispec.Image{
		Config: ocispec.ImageConfig{
			Env: []string{"PATH=/usr/sbin:/usr/bin", "OVS=1", "LANG=C"}, Entrypoint: []string{"/start.sh"}, Cmd: []string{"--x"},
			User: "0", WorkingDir: "/var/run", Labels: map[string]string{"vendor": "base", "org.opencontainers.image.title": "base"},
		},
		History: []ocispec.History{{CreatedBy: "base layer"}},
	}
	img := plan.Image{Name: "agent", Image: config.Image{Env: map[string]string{"LANG": "C.UTF-8"}, Labels: map[string]string{"org.opencontainers.image.title": "agent"}}}
	c := Config(p, img, ocispec.Platform{OS: "linux", Architecture: "amd64"}, base)
	if want := []string{"PATH=/usr/sbin:/usr/bin", "OVS=1", "LANG=C.UTF-8"}; !slices.Equal(c.Config.Env, want) {
		t.Errorf("env %q, want %q", c.Config.Env, want)
	}
	if !slices.Equal(c.Config.Entrypoint, []string{"/start.sh"}) || !slices.Equal(c.Config.Cmd, []string{"--x"}) || c.Config.User != "0" || c.Config.WorkingDir != "/var/run" {
		t.Errorf("inherited %+v", c.Config)
	}
	if c.Config.Labels["vendor"] != "base" || c.Config.Labels["org.opencontainers.image.title"] != "agent" {
		t.Errorf("labels %v", c.Config.Labels)
	}
	if len(c.History) != 2 || c.History[0].CreatedBy != "base layer" {
		t.Errorf("history %+v; want the base's then kiln's", c.History)
	}
	img.Entrypoint, img.User = []string{"/usr/local/bin/agent"}, "65532"
	c = Config(p, img, ocispec.Platform{OS: "linux", Architecture: "amd64"}, base)
	if !slices.Equal(c.Config.Entrypoint, []string{"/usr/local/bin/agent"}) || c.Config.Cmd != nil || c.Config.User != "65532" {
		t.Errorf("an entrypoint of its own drops the base's args: %+v", c.Config)
	}
}
