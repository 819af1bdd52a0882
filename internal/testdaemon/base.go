package testdaemon

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moby/buildkit/client"
	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/exporter/containerimage/exptypes"
	gateway "github.com/moby/buildkit/frontend/gateway/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/tonistiigi/fsutil"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
)

// BusyboxARM64 is where .ci/run puts Debian's busybox-static for arm64.
const BusyboxARM64 = "/usr/local/share/kiln-test/busybox-arm64"

// PushBase builds a base image of the kind Antrea's agent runs on, for
// linux/amd64 and linux/arm64 (files, a static busybox from Debian's
// busybox-static with /bin/sh, root user, an env and a label), pushes it to
// the registry as repo:1 and returns its reference pinned by digest.
func (r *Registry) PushBase(t *testing.T, d *buildkit.Daemon, repo string) string {
	t.Helper()
	busybox := map[string]string{"amd64": "/bin/busybox", "arm64": BusyboxARM64}
	for arch, path := range busybox {
		if _, err := os.Stat(path); err != nil {
			Unavailable(t, "busybox for %s missing at %s (apt-get install busybox-static; .ci/run fetches the arm64 one)", arch, path)
		}
	}
	// Later than any commit a test makes: an exporter that rewrote the
	// base's layer times would change its layers.
	created := time.Unix(1900000000, 0).UTC()
	targets := []ocispec.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}}
	build := func(ctx context.Context, c gateway.Client) (*gateway.Result, error) {
		res := gateway.NewResult()
		var exp exptypes.Platforms
		for _, p := range targets {
			id := config.FormatPlatform(p)
			// busybox is setuid, as a real base's mount or su is, so an
			// image on this base needs kiln's setuid allow-list.
			bb := llb.Local("busybox-"+p.Architecture, llb.IncludePatterns([]string{filepath.Base(busybox[p.Architecture])}))
			st := llb.Scratch().Platform(p).File(llb.Mkdir("/etc", 0o755, llb.WithCreatedTime(created)).
				Mkfile("/etc/os-release", 0o644, []byte("ID=kiln-test-base\n"), llb.WithCreatedTime(created)).
				Mkfile("/etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n"), llb.WithCreatedTime(created)).
				Mkdir("/bin", 0o755, llb.WithCreatedTime(created)).
				Copy(bb, filepath.Base(busybox[p.Architecture]), "/bin/busybox", &llb.CopyInfo{Mode: &llb.ChmodOpt{Mode: 0o4755}, CreatedTime: &created}).
				Symlink("busybox", "/bin/sh", llb.WithCreatedTime(created)))
			def, err := st.Marshal(ctx)
			if err != nil {
				return nil, err
			}
			rr, err := c.Solve(ctx, gateway.SolveRequest{Definition: def.ToPB()})
			if err != nil {
				return nil, err
			}
			ref, err := rr.SingleRef()
			if err != nil {
				return nil, err
			}
			cfg, _ := json.Marshal(ocispec.Image{Created: &created, Platform: p, RootFS: ocispec.RootFS{Type: "layers"},
				Config: ocispec.ImageConfig{User: "0", Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "BASE=kiln-test"},
					Entrypoint: []string{"/bin/sh"}, Labels: map[string]string{"vendor": "kiln-test-base"}}})
			res.AddRef(id, ref)
			res.AddMeta(exptypes.ExporterImageConfigKey+"/"+id, cfg)
			exp.Platforms = append(exp.Platforms, exptypes.Platform{ID: id, Platform: p})
		}
		dt, _ := json.Marshal(exp)
		res.AddMeta(exptypes.ExporterPlatformsKey, dt)
		return res, nil
	}
	mounts := map[string]fsutil.FS{}
	for arch, path := range busybox {
		fs, err := fsutil.NewFS(filepath.Dir(path))
		if err != nil {
			t.Fatal(err)
		}
		mounts["busybox-"+arch] = fs
	}
	name := r.Addr + "/" + repo + ":1"
	ctx := context.Background()
	resp, err := d.Client.Build(ctx, client.SolveOpt{
		Exports: []client.ExportEntry{{Type: client.ExporterImage, Attrs: map[string]string{
			"name": name, "push": "true", "oci-mediatypes": "true", "rewrite-timestamp": "true", "source-date-epoch": "1900000000"}}},
		LocalMounts: mounts,
		Session:     buildkit.AuthSession(ctx, []string{r.Addr}),
	}, "", build, nil)
	if err != nil {
		t.Fatalf("push the base image %s: %v", name, err)
	}
	return name + "@" + resp.ExporterResponse[exptypes.ExporterImageDigestKey]
}
