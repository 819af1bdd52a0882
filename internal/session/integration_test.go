package session_test

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/buildkit/client/llb"

	fileexport "github.com/kiln-build/kiln/internal/buildkit/export"
	"github.com/kiln-build/kiln/internal/buildkit/managed"
	"github.com/kiln-build/kiln/internal/explain"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/testdaemon"
	"github.com/kiln-build/kiln/internal/verify"
	"github.com/kiln-build/kiln/internal/verify/inspect"
)

func TestImagesIntegration(t *testing.T) {
	d := testdaemon.Shared(t)
	root := testdaemon.RepoRoot(t)
	ctx := context.Background()
	opts := session.Options{Root: root, Platforms: "linux/amd64,linux/arm64", Progress: "quiet", OutDir: t.TempDir()}

	outcome, err := session.Images(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	first := outcome.Images
	if outcome.Checks == nil || outcome.Checks.Failed() != 0 || len(outcome.Checks.Checks) == 0 {
		t.Errorf("the quick checks after the build did not pass: %+v", outcome.Checks)
	}
	if len(first) != 2 {
		t.Fatalf("built %d images, want antrea-agent and antrea-controller", len(first))
	}
	wantBinaries := map[string][]string{
		"antrea-agent":      {"antrea-agent", "antrea-cni", "antctl"},
		"antrea-controller": {"antrea-controller", "antctl"},
	}
	for _, img := range first {
		t.Run("inspect "+img.Name, func(t *testing.T) {
			layout, err := inspect.ReadLayout(img.Path)
			if err != nil {
				t.Fatal(err)
			}
			if layout.IndexDigest != img.Digest {
				t.Errorf("index digest %s in the tarball, %s reported", layout.IndexDigest, img.Digest)
			}
			var plats []string
			for _, m := range layout.Manifests {
				plats = append(plats, m.Platform)
			}
			if strings.Join(plats, ",") != "linux/amd64,linux/arm64" {
				t.Fatalf("index platforms %v, want linux/amd64 then linux/arm64", plats)
			}
			for _, m := range layout.Manifests {
				if m.Config.Config.User != "65532:65532" {
					t.Errorf("%s: user %q, want 65532:65532", m.Platform, m.Config.Config.User)
				}
				if tmp, _ := m.File("tmp"); tmp.Mode&0o7777 != 0o1777 {
					t.Errorf("%s: /tmp mode %o, want 1777", m.Platform, tmp.Mode)
				}
				for _, l := range m.Layers {
					for _, f := range l.Files {
						if f.UID != 0 || f.GID != 0 {
							t.Errorf("%s: %s owned by %d:%d, want root", m.Platform, f.Path, f.UID, f.GID)
						}
					}
				}
				for _, b := range wantBinaries[img.Name] {
					f, ok := m.File("usr/local/bin/" + b)
					if !ok {
						t.Errorf("%s: %s missing", m.Platform, b)
						continue
					}
					checkELF(t, m.Platform+" "+b, f.Data, m.Platform)
				}
			}
			antctl, _ := layout.Manifests[0].File("usr/local/bin/antctl")
			out := runBinary(t, antctl.Data, "version")
			for _, want := range []string{"antctl version", "linux/amd64", "cgo=off", "go1.26.8"} {
				if !strings.Contains(out, want) {
					t.Errorf("antctl version says %q, want %q in it", out, want)
				}
			}
		})
	}

	t.Run("a no-op build sends no image and leaves the tarballs in place", func(t *testing.T) {
		before := map[string]time.Time{}
		for _, img := range first {
			fi, err := os.Stat(img.Path)
			if err != nil {
				t.Fatal(err)
			}
			before[img.Path] = fi.ModTime()
		}
		again, err := session.Images(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		sameDigests(t, first, again.Images)
		for _, img := range again.Images {
			if fi, err := os.Stat(img.Path); err != nil || !fi.ModTime().Equal(before[img.Path]) {
				t.Errorf("%s was written again (%v)", img.Path, err)
			}
		}
	})

	t.Run("same digests from another checkout directory", func(t *testing.T) {
		copyDir := t.TempDir()
		testdaemon.CopyTree(t, root, copyDir)
		o := opts
		o.Root, o.OutDir = copyDir, t.TempDir()
		again, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		sameDigests(t, first, again.Images)
	})

	t.Run("an edit to README.md rebuilds nothing", func(t *testing.T) {
		o := editedCopy(t, opts, "README.md")
		again, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if ran := again.Ran("go build"); len(ran) != 0 {
			t.Errorf("compile steps ran: %v", ran)
		}
		if ran := again.Ran("binary"); len(ran) != 0 {
			t.Errorf("binaries changed: %v", ran)
		}
		sameDigests(t, first, again.Images)
	})

	t.Run("an edit to an agent-only package changes only the agent, and explain says why", func(t *testing.T) {
		o := editedCopy(t, opts, "")
		if _, err := session.Images(ctx, o); err != nil {
			t.Fatal(err)
		}
		agent := filepath.Join(o.Root, "pkg/agent/agent.go")
		// A variable nothing reads: go build runs, the linker drops it, and
		// no binary or image changes.
		testdaemon.AppendLine(t, agent, "\nvar editedByATest = 1\n")
		unread, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if ran := unread.Ran("binary"); len(ran) != 0 {
			t.Errorf("binaries changed by dead code: %v", ran)
		}
		sameDigests(t, first, unread.Images)
		for _, e := range unread.Explanations {
			if e.Ran && !strings.HasSuffix(e.Step, "] go build") {
				t.Errorf("%s ran after an edit the linker drops", e.Step)
			}
		}

		// An init that writes it: code the linker keeps.
		testdaemon.AppendLine(t, agent, "\nfunc init() { editedByATest++ }\n")
		again, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"[antrea-agent linux/amd64] binary", "[antrea-agent linux/arm64] binary"}
		ran := again.Ran("binary")
		slices.Sort(ran)
		if !slices.Equal(ran, want) {
			t.Errorf("binaries that changed: %v, want %v", ran, want)
		}
		if again.Images[1].Digest != first[1].Digest {
			t.Errorf("antrea-controller changed: %s, was %s", again.Images[1].Digest, first[1].Digest)
		}
		var explained []string
		for _, e := range again.Explanations {
			if !e.Ran {
				continue
			}
			explained = append(explained, e.Step)
			want := []string{"file pkg/agent/agent.go changed"}
			if strings.HasSuffix(e.Step, "assemble image") {
				want = []string{"binary antrea-agent changed"}
			}
			if !slices.Equal(e.Causes, want) {
				t.Errorf("%s ran because %v, want %v", e.Step, e.Causes, want)
			}
		}
		slices.Sort(explained)
		wantExplained := []string{"[antrea-agent linux/amd64] assemble image", "[antrea-agent linux/amd64] binary", "[antrea-agent linux/arm64] assemble image", "[antrea-agent linux/arm64] binary", "[linux/amd64] go build", "[linux/arm64] go build"}
		if !slices.Equal(explained, wantExplained) {
			t.Errorf("explained steps %v, want %v", explained, wantExplained)
		}
	})

	t.Run("up-to-date images are kept without a solve; an edit, its revert and a tampered tarball rebuild", func(t *testing.T) {
		o := editedCopy(t, opts, "")
		a, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		kept, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if ran := kept.Ran(""); len(ran) != 0 {
			t.Errorf("steps ran although nothing changed: %v", ran)
		}
		sameDigests(t, a.Images, kept.Images)
		agent := filepath.Join(o.Root, "pkg/agent/agent.go")
		orig, err := os.ReadFile(agent)
		if err != nil {
			t.Fatal(err)
		}
		// An init that writes a variable: code the linker keeps.
		testdaemon.AppendLine(t, agent, "\nvar editedByATest = 1\n\nfunc init() { editedByATest++ }\n")
		edited, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if edited.Images[0].Digest == a.Images[0].Digest {
			t.Fatalf("the agent edit kept digest %s", a.Images[0].Digest)
		}
		// Every step of the reverted tree is in the daemon's cache; the
		// tarball on disk is the edited one and must be replaced.
		if err := os.WriteFile(agent, orig, 0o644); err != nil {
			t.Fatal(err)
		}
		reverted, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		sameDigests(t, a.Images, reverted.Images)
		layout, err := inspect.ReadLayout(reverted.Images[0].Path)
		if err != nil || layout.IndexDigest != a.Images[0].Digest {
			t.Fatalf("after the revert the tarball holds %v (%v), want %s", layout, err, a.Images[0].Digest)
		}
		if err := os.WriteFile(reverted.Images[0].Path, []byte("not an image"), 0o644); err != nil {
			t.Fatal(err)
		}
		repaired, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if layout, err := inspect.ReadLayout(repaired.Images[0].Path); err != nil || layout.IndexDigest != a.Images[0].Digest {
			t.Errorf("a tampered tarball was kept: %v", err)
		}
	})

	t.Run("a build whose new images fail the quick checks leaves the last ones", func(t *testing.T) {
		o := editedCopy(t, opts, "")
		o.Platforms, o.Images = "linux/amd64", []string{"antrea-agent"}
		last, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		layout, err := inspect.ReadLayout(last.Images[0].Path)
		if err != nil {
			t.Fatal(err)
		}
		cni, _ := layout.Manifests[0].File("usr/local/bin/antrea-cni")
		// The plugin changes, and its budget is a byte under its size today.
		testdaemon.AppendLine(t, filepath.Join(o.Root, "pkg", "cni", "cni.go"), "\nvar grownByATest = 1\n\nfunc init() { grownByATest++ }\n")
		kiln := filepath.Join(o.Root, "build", "kiln.yaml")
		data, _ := os.ReadFile(kiln)
		if err := os.WriteFile(kiln, []byte(strings.Replace(string(data), "antrea-cni: 3MiB", fmt.Sprintf("antrea-cni: %d", len(cni.Data)-1), 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := session.Images(ctx, o); err == nil || !strings.Contains(err.Error(), "exceeds the budget") || !strings.Contains(err.Error(), "not written") {
			t.Fatalf("images with the plugin over its budget: %v; want the budget named and nothing written", err)
		}
		if now, err := inspect.ReadLayout(last.Images[0].Path); err != nil || now.IndexDigest != last.Images[0].Digest {
			t.Errorf("the failing build replaced the last agent image: %v, digest %v, want %s", err, now, last.Images[0].Digest)
		}
	})

	t.Run("a no-op is answered from the stat of what the last build read; a change to any of it builds", func(t *testing.T) {
		defer session.TrustRecentInputs()()
		o := editedCopy(t, opts, "")
		o.Platforms = "linux/amd64"
		agent := filepath.Join(o.Root, "pkg/agent/agent.go")
		testdaemon.AppendLine(t, agent, "\nvar noopTest = 1\n\nfunc init() { noopTest++ }\n")
		built, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if !session.AnsweredAsNoop(o, "images") {
			t.Fatal("a build of an unchanged tree is not answered from its record")
		}
		kept, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		sameDigests(t, built.Images, kept.Images)
		if !kept.Images[0].Kept || len(kept.Ran("")) != 0 || kept.Checks == nil {
			t.Errorf("the no-op kept %v, ran %v, checks %v", kept.Images[0].Kept, kept.Ran(""), kept.Checks)
		}
		if ex, err := session.Explain(o); err != nil || len(ex) == 0 || slices.ContainsFunc(ex, func(e explain.Explanation) bool { return e.Ran }) {
			t.Errorf("explain after a no-op: %+v %v", ex, err)
		}
		// Every change must build. BuildKit's own transfer of the sources
		// decides by size and modification time as well, so the daemon is
		// not sent the first change; kiln must not answer it either.
		const unchecked, same, differs = 0, 1, 2
		changes := []struct {
			name   string
			change func(t *testing.T)
			agent  int
		}{
			{"the same size and modification time, other bytes", func(t *testing.T) {
				fi, err := os.Stat(agent)
				if err != nil {
					t.Fatal(err)
				}
				data, err := os.ReadFile(agent)
				if err != nil {
					t.Fatal(err)
				}
				data = bytes.Replace(data, []byte("noopTest = 1"), []byte("noopTest = 7"), 1)
				if err := os.WriteFile(agent, data, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Chtimes(agent, fi.ModTime(), fi.ModTime()); err != nil {
					t.Fatal(err)
				}
			}, unchecked},
			{"a new file in a package directory", func(t *testing.T) {
				extra := "package agent\n\nvar noopExtra = 1\n\nfunc init() { noopExtra++ }\n"
				if err := os.WriteFile(filepath.Join(o.Root, "pkg/agent/noop_extra.go"), []byte(extra), 0o644); err != nil {
					t.Fatal(err)
				}
			}, differs},
			{"an environment variable", func(t *testing.T) { t.Setenv("KILN_NOOP_TEST", "1") }, same},
			{"a comment in image.yaml", func(t *testing.T) {
				testdaemon.AppendLine(t, filepath.Join(o.Root, "images/antrea-agent/image.yaml"), "\n# edited by a test\n")
			}, same},
			{"a removed tarball", func(t *testing.T) {
				if err := os.Remove(kept.Images[0].Path); err != nil {
					t.Fatal(err)
				}
			}, same},
		}
		before := kept.Images
		for _, c := range changes {
			if !session.AnsweredAsNoop(o, "images") {
				t.Fatalf("before %s, the build of an unchanged tree is not answered from its record", c.name)
			}
			c.change(t)
			if session.AnsweredAsNoop(o, "images") {
				t.Errorf("after %s, the build is still answered from the record", c.name)
			}
			after, err := session.Images(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			if changed := after.Images[0].Digest != before[0].Digest; c.agent != unchecked && changed != (c.agent == differs) {
				t.Errorf("after %s: agent digest changed %v, want %v", c.name, changed, !changed)
			}
			if _, err := inspect.ReadLayout(after.Images[0].Path); err != nil {
				t.Errorf("after %s: %v", c.name, err)
			}
			before = after.Images
		}
	})

	t.Run("an edit to a file the agent embeds from a subdirectory relinks only the agent", func(t *testing.T) {
		const embedded = "pkg/agent/config/defaults/antrea-agent.conf"
		o := editedCopy(t, opts, "")
		if _, err := session.Images(ctx, o); err != nil {
			t.Fatal(err)
		}
		testdaemon.AppendLine(t, filepath.Join(o.Root, embedded), "# edited by a test\n")
		again, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		ran := again.Ran("binary")
		slices.Sort(ran)
		if want := []string{"[antrea-agent linux/amd64] binary", "[antrea-agent linux/arm64] binary"}; !slices.Equal(ran, want) {
			t.Errorf("binaries that changed: %v, want %v", ran, want)
		}
		for _, e := range again.Explanations {
			want := []string{"file " + embedded + " changed"}
			if strings.HasSuffix(e.Step, "assemble image") {
				want = []string{"binary antrea-agent changed"}
			}
			if e.Ran && !slices.Equal(e.Causes, want) {
				t.Errorf("%s ran because %v, want %v", e.Step, e.Causes, want)
			}
		}
		layout, err := inspect.ReadLayout(again.Images[0].Path)
		if err != nil {
			t.Fatal(err)
		}
		agent, _ := layout.Manifests[0].File("usr/local/bin/antrea-agent")
		if out := runBinary(t, agent.Data, "-default-config"); !strings.Contains(out, "edited by a test") {
			t.Errorf("the agent's embedded configuration is %q, want the edit in it", out)
		}
	})

	t.Run("a budget one byte under the real size fails verify", func(t *testing.T) {
		layout, err := inspect.ReadLayout(first[0].Path)
		if err != nil {
			t.Fatal(err)
		}
		cni, _ := layout.Manifests[0].File("usr/local/bin/antrea-cni")
		o := editedCopy(t, opts, "")
		kiln := filepath.Join(o.Root, "build", "kiln.yaml")
		data, _ := os.ReadFile(kiln)
		data = []byte(strings.Replace(string(data), "antrea-cni: 3MiB", fmt.Sprintf("antrea-cni: %d", len(cni.Data)-1), 1))
		os.WriteFile(kiln, data, 0o644)
		report, err := verify.Verify(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		var failed []inspect.Check
		for _, c := range report.Checks {
			if !c.OK {
				failed = append(failed, c)
			}
		}
		if len(failed) != 1 || failed[0].Check != "budget" || failed[0].Subject != "antrea-cni linux/amd64" {
			t.Fatalf("failed checks %+v, want the amd64 antrea-cni budget alone", failed)
		}
		if !strings.Contains(failed[0].Detail, "exceeds the budget") || !strings.Contains(failed[0].Detail, "runtime") {
			t.Errorf("budget failure does not name the size and the biggest contributors: %s", failed[0].Detail)
		}
	})

	t.Run("a heavy import into the CNI plugin fails verify, naming the module that grew", func(t *testing.T) {
		// One platform: the budget check is the same on each, and the other
		// would compile the Prometheus client's graph again.
		o := editedCopy(t, opts, "")
		o.Platforms = "linux/amd64"
		if report, err := verify.Verify(ctx, o); err != nil || report.Failed() != 0 {
			t.Fatalf("verify before the edit: %v, %+v", err, report)
		}
		cni := filepath.Join(o.Root, "pkg", "cni", "cni.go")
		data, _ := os.ReadFile(cni)
		data = bytes.Replace(data, []byte("import (\n"), []byte("import (\n\t\"github.com/prometheus/client_golang/prometheus\"\n"), 1)
		data = append(data, "\n// registry pulls the Prometheus client into the plugin, as a careless import would.\nvar registry = prometheus.NewRegistry()\n"...)
		os.WriteFile(cni, data, 0o644)
		report, err := verify.Verify(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		var failed []string
		for _, c := range report.Checks {
			if !c.OK {
				failed = append(failed, c.Subject+": "+c.Detail)
				if c.Check != "budget" || !strings.HasPrefix(c.Subject, "antrea-cni ") || !strings.Contains(c.Detail, "github.com/prometheus/client_golang") {
					t.Errorf("failed check %s %s: %s; want the antrea-cni budget, naming the Prometheus client", c.Check, c.Subject, c.Detail)
				}
			}
		}
		if len(failed) == 0 {
			t.Error("verify passed with the Prometheus client in the CNI plugin")
		}
	})

	t.Run("repro diff locates planted nondeterminism", func(t *testing.T) {
		a, err := inspect.ReadLayout(first[1].Path)
		if err != nil {
			t.Fatal(err)
		}
		// A -X value that differs between builds: release stamping.
		o := opts
		o.OutDir, o.Stamp = t.TempDir(), true
		stamped, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		b, err := inspect.ReadLayout(stamped.Images[1].Path)
		if err != nil {
			t.Fatal(err)
		}
		report := diffText(inspect.DiffLayouts("antrea-controller", a, b))
		for _, want := range []string{"linux/amd64 file /usr/local/bin/antrea-controller", "ELF sections differ", ".rodata", "config config.Labels.org.opencontainers.image.version"} {
			if !strings.Contains(report, want) {
				t.Errorf("diff does not mention %q:\n%s", want, report)
			}
		}
		// Files with another mtime: a different source date.
		t.Setenv("SOURCE_DATE_EPOCH", "1000000000")
		o.Stamp, o.OutDir = false, t.TempDir()
		dated, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		c, err := inspect.ReadLayout(dated.Images[1].Path)
		if err != nil {
			t.Fatal(err)
		}
		report = diffText(inspect.DiffLayouts("antrea-controller", a, c))
		for _, want := range []string{"file /etc/passwd: mtime", "2001-09-09T01:46:40Z", "config created"} {
			if !strings.Contains(report, want) {
				t.Errorf("diff does not mention %q:\n%s", want, report)
			}
		}
	})

	// Invariant 3: the host's Go reaches no step. mage compiled by another
	// Go (unoptimised and without DWARF, to take less CPU), from another go
	// command, in another checkout, makes the same LLB: kiln lists the
	// packages with the pinned toolchain, not the host's Go, so every step
	// is reused from the build the host's Go just made, and the digests
	// agree. That a build from nothing reproduces is TestRelease's:
	// release:verify rebuilds a release platform in isolation and finds
	// it identical to the release, made on the daemon's trusted caches.
	t.Run("images, by mage under another Go, reuses every step and gives the same digests", func(t *testing.T) {
		o := opts
		o.Platforms, o.OutDir = "linux/amd64", t.TempDir()
		host, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		tree := t.TempDir()
		testdaemon.CopyTree(t, root, tree)
		cmd := exec.Command("go", "run", "mage.go", "images", "-platforms=linux/amd64", "-progress=quiet", "-explain")
		cmd.Dir = tree
		cmd.Env = append(os.Environ(), "GOTOOLCHAIN=go1.27.3", "GOFLAGS='-gcflags=all=-N -l -dwarf=false'")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("images under go1.27.3: %v\n%s", err, out)
		}
		reused := regexp.MustCompile(`(?m)^(\d+) of (\d+) tracked steps reused$`).FindSubmatch(out)
		if reused == nil || string(reused[1]) != string(reused[2]) || string(reused[2]) == "0" {
			t.Errorf("images under go1.27.3 ran steps the host's build had made:\n%s", out)
		}
		for _, img := range host.Images {
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(img.Ref+"\t"+img.Digest+"\t")).Match(out) {
				t.Errorf("%s: under go1.27.3 not %s:\n%s", img.Ref, img.Digest, out)
			}
		}
	})

	t.Run("buildkit:prune keeps the module layer: only the go builds run again", func(t *testing.T) {
		if err := managed.PruneUnkept(ctx, d, nil); err != nil {
			t.Fatal(err)
		}
		o := opts
		o.OutDir = t.TempDir()
		again, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		sameDigests(t, first, again.Images)
		if ran := again.Ran("module layer"); len(ran) != 0 {
			t.Errorf("the module layer was made again after buildkit:prune: %v", ran)
		}
		if ran := again.Ran("go build"); len(ran) != 2 {
			t.Errorf("the go builds after buildkit:prune: %v, want both platforms' (the prune removed their outputs)", ran)
		}
	})

	t.Run("binaries", func(t *testing.T) {
		o := opts
		o.Platforms = "linux/amd64,linux/arm64"
		o.OutDir = t.TempDir()
		o.Rebuild = true // a forced build records its outputs too
		out, err := session.Binaries(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		dir := out.Dir
		for _, plat := range []string{"linux_amd64", "linux_arm64"} {
			for _, b := range []string{"antctl", "antrea-agent", "antrea-cni", "antrea-controller"} {
				data, err := os.ReadFile(filepath.Join(dir, plat, b))
				if err != nil {
					t.Fatal(err)
				}
				checkELF(t, plat+" "+b, data, strings.ReplaceAll(plat, "_", "/"))
			}
		}
		o.Rebuild = false
		again, err := session.Binaries(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if !again.Kept {
			t.Error("the binaries were built again although nothing changed")
		}
		if ran := again.Ran(""); len(ran) != 0 {
			t.Errorf("steps ran although the binaries were up to date: %v", ran)
		}
		gone := filepath.Join(dir, "linux_arm64", "antctl")
		if err := os.Remove(gone); err != nil {
			t.Fatal(err)
		}
		if _, err := session.Binaries(ctx, o); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(gone); err != nil {
			t.Errorf("a deleted binary was not written again: %v", err)
		}
		cni := exec.Command(filepath.Join(dir, "linux_amd64", "antrea-cni"))
		cni.Env = []string{"CNI_COMMAND=VERSION"}
		if out, err := cni.Output(); err != nil || !strings.Contains(string(out), `"supportedVersions"`) {
			t.Errorf("antrea-cni VERSION: %v %s", err, out)
		}
	})

	t.Run("an export reads every byte of every file through the gateway", func(t *testing.T) {
		s, err := session.Start(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		// Sizes around the read chunk, from two steps (so the export waits
		// for both in one solve first), some into folders of their own.
		rnd := rand.New(rand.NewPCG(16, 2))
		sizes := []int{0, 1, fileexport.ReadChunk, fileexport.ReadChunk + 1, 2*fileexport.ReadChunk + 12345}
		want := map[string][]byte{}
		var files []fileexport.FileCopy
		for i, n := range sizes {
			data := make([]byte, n)
			for j := range data {
				data[j] = byte(rnd.Uint32())
			}
			name := fmt.Sprintf("f%d", i)
			from := llb.Scratch().File(llb.Mkfile("/"+name, 0o644, data), llb.WithCustomNamef("[test] file of %d bytes", n))
			dest := fmt.Sprintf("/d%d/%s", i%2, name)
			files = append(files, fileexport.FileCopy{From: from, Src: "/" + name, Dest: dest})
			want[dest] = data
		}
		parent := t.TempDir()
		dest := filepath.Join(parent, "files")
		_, sent, err := s.ExportFiles(ctx, "test export", files, dest, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(sent) != len(files) {
			t.Errorf("sent %v, want all %d files", sent, len(files))
		}
		for path, data := range want {
			got, err := os.ReadFile(filepath.Join(dest, path))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Errorf("%s: %d bytes differ from the %d the step wrote", path, len(got), len(data))
			}
			if fi, err := os.Stat(filepath.Join(dest, path)); err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("%s: mode %v (%v), want 0755", path, fi.Mode(), err)
			}
		}

		// A file the step does not have fails the export as a whole: the
		// old folder stays as it was and no temporary one is left.
		bad := append(slices.Clone(files), fileexport.FileCopy{From: files[0].From, Src: "/missing", Dest: "/missing"})
		if _, _, err := s.ExportFiles(ctx, "test export", bad, dest, nil); err == nil || !strings.Contains(err.Error(), "missing") {
			t.Errorf("exporting a missing file: %v, want an error naming it", err)
		}
		// Two files to one place fail the export before a byte is read.
		twice := append(slices.Clone(files), fileexport.FileCopy{From: files[4].From, Src: files[4].Src, Dest: files[3].Dest})
		if _, _, err := s.ExportFiles(ctx, "test export", twice, dest, nil); err == nil || !strings.Contains(err.Error(), "exists") {
			t.Errorf("exporting two files to %s: %v, want an error", files[3].Dest, err)
		}
		entries, _ := os.ReadDir(parent)
		if len(entries) != 1 || entries[0].Name() != "files" {
			t.Errorf("after failed exports the parent folder holds %v, want only files", entries)
		}
		if got, _ := os.ReadFile(filepath.Join(dest, "/d0/f4")); !bytes.Equal(got, want["/d0/f4"]) {
			t.Error("a failed export changed the folder it would have replaced")
		}
	})

	t.Run("an export writes into the file it replaced, never into one linked elsewhere or running", func(t *testing.T) {
		s, err := session.Start(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		parent := t.TempDir()
		dest := filepath.Join(parent, "files")
		spare := filepath.Join(parent, ".files.spare", "d%2Fa")
		export := func(n, size int) []byte {
			t.Helper()
			data := bytes.Repeat([]byte{byte(n)}, size)
			from := llb.Scratch().File(llb.Mkfile("/a", 0o644, data), llb.WithCustomNamef("[test] export %d", n))
			if _, _, err := s.ExportFiles(ctx, "test export", []fileexport.FileCopy{{From: from, Src: "/a", Dest: "/d/a"}}, dest, nil); err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(filepath.Join(dest, "d", "a")); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("export %d: %d bytes, want %d bytes of %d (%v)", n, len(got), size, n, err)
			}
			return data
		}
		inode := func(path string) uint64 {
			t.Helper()
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			return fi.Sys().(*syscall.Stat_t).Ino
		}
		export(1, 3*fileexport.ReadChunk+7)
		first := inode(filepath.Join(dest, "d", "a"))
		export(2, fileexport.ReadChunk)
		if inode(spare) != first {
			t.Fatal("the file the second export replaced is not kept as the spare")
		}
		second := inode(filepath.Join(dest, "d", "a"))
		export(3, 2*fileexport.ReadChunk+1) // shorter than the spare: cut to size
		if inode(filepath.Join(dest, "d", "a")) != first || inode(spare) != second {
			t.Error("the third export did not write into the first one's file")
		}
		// A spare someone linked elsewhere keeps its bytes.
		theirs := filepath.Join(t.TempDir(), "theirs")
		if err := os.Link(spare, theirs); err != nil {
			t.Fatal(err)
		}
		export(4, 5*fileexport.ReadChunk) // longer than the spare
		if got, _ := os.ReadFile(theirs); !bytes.Equal(got, bytes.Repeat([]byte{2}, fileexport.ReadChunk)) || inode(filepath.Join(dest, "d", "a")) == second {
			t.Error("an export wrote into a spare another name links")
		}
		// So does one a process has open, and one a process runs.
		reader, err := os.Open(spare)
		if err != nil {
			t.Fatal(err)
		}
		defer reader.Close()
		held := inode(spare)
		export(5, fileexport.ReadChunk+5)
		if got, _ := io.ReadAll(reader); !bytes.Equal(got, bytes.Repeat([]byte{3}, 2*fileexport.ReadChunk+1)) || inode(filepath.Join(dest, "d", "a")) == held {
			t.Error("an export wrote into a spare a process has open")
		}
		sleep, err := exec.LookPath("sleep")
		if err != nil {
			t.Fatal(err)
		}
		prog, _ := os.ReadFile(sleep)
		os.Remove(spare)
		if err := os.WriteFile(spare, prog, 0o755); err != nil {
			t.Fatal(err)
		}
		run := exec.Command(spare, "60")
		if err := run.Start(); err != nil {
			t.Fatal(err)
		}
		defer run.Process.Kill()
		export(6, fileexport.ReadChunk+3)
		if got, err := os.ReadFile(fmt.Sprintf("/proc/%d/exe", run.Process.Pid)); err != nil || !bytes.Equal(got, prog) {
			t.Errorf("an export wrote into a spare a process runs (%v)", err)
		}
		// A spare folder that links elsewhere is neither used nor written.
		other := t.TempDir()
		if err := os.WriteFile(filepath.Join(other, "d%2Fa"), []byte("theirs"), 0o644); err != nil {
			t.Fatal(err)
		}
		os.RemoveAll(filepath.Join(parent, ".files.spare"))
		if err := os.Symlink(other, filepath.Join(parent, ".files.spare")); err != nil {
			t.Fatal(err)
		}
		export(7, 10)
		export(8, 11)
		if got, _ := os.ReadFile(filepath.Join(other, "d%2Fa")); string(got) != "theirs" {
			t.Errorf("an export used a spare folder that links elsewhere: it holds %q", got)
		}
		if entries, _ := os.ReadDir(parent); len(entries) != 2 {
			t.Errorf("beside the export: %v, want files and its spares", entries)
		}
	})

	t.Run("an edit relinks only the binary it reaches; the others are kept", func(t *testing.T) {
		o := editedCopy(t, opts, "")
		o.Platforms = "linux/amd64"
		first, err := session.Binaries(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		file := func(name string) (uint64, []byte) {
			t.Helper()
			path := filepath.Join(first.Dir, "linux_amd64", name)
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			return fi.Sys().(*syscall.Stat_t).Ino, data
		}
		names := []string{"antctl", "antrea-agent", "antrea-cni", "antrea-controller"}
		inodes, contents := map[string]uint64{}, map[string][]byte{}
		for _, n := range names {
			inodes[n], contents[n] = file(n)
		}
		testdaemon.AppendLine(t, filepath.Join(o.Root, "pkg/agent/agent.go"), "\nfunc init() { println() }\n")
		var progress bytes.Buffer
		o.Progress, o.ProgressOut, o.TraceCompiles = "plain", &progress, true
		if _, err := session.Binaries(ctx, o); err != nil {
			t.Fatal(err)
		}
		links := strings.Count(progress.String(), "/pkg/tool/linux_amd64/link -o ")
		written := regexp.MustCompile(`(?m)(?:cp|mv) \S+ /kiln/keep/(\S+)$`).FindAllStringSubmatch(progress.String(), -1)
		if links != 1 || len(written) != 1 || written[0][1] != "antrea-agent" {
			t.Errorf("%d links, wrote %v; want one link, of antrea-agent alone:\n%s", links, written, progress.String())
		}
		// Only the agent came from the daemon; the others are the files
		// written before, linked into the new directory.
		for _, n := range names {
			ino, data := file(n)
			if changed := n == "antrea-agent"; (ino != inodes[n]) != changed || bytes.Equal(data, contents[n]) == changed {
				t.Errorf("%s: inode %d, was %d; same bytes %t; want it sent again only if it changed", n, ino, inodes[n], bytes.Equal(data, contents[n]))
			}
		}

		// A rewrite that keeps the size and sets the time back is written over.
		antctl := filepath.Join(first.Dir, "linux_amd64", "antctl")
		fi, err := os.Stat(antctl)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(antctl, bytes.Repeat([]byte{'x'}, int(fi.Size())), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(antctl, fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
		o.Progress, o.ProgressOut, o.TraceCompiles = "quiet", nil, false
		if _, err := session.Binaries(ctx, o); err != nil {
			t.Fatal(err)
		}
		if _, data := file("antctl"); !bytes.Equal(data, contents["antctl"]) {
			t.Error("a rewritten antctl with its old size and time was kept")
		}
	})

	t.Run("compile error shows that step's output only", func(t *testing.T) {
		copyDir := t.TempDir()
		testdaemon.CopyTree(t, root, copyDir)
		bad := filepath.Join(copyDir, "pkg", "cni", "cni.go")
		src, err := os.ReadFile(bad)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(bad, append(src, []byte("\nfunc broken() { undefinedThing() }\n")...), 0o644)
		out := filepath.Join(copyDir, "_output")
		_, err = session.Binaries(ctx, session.Options{Root: copyDir, Platforms: "linux/amd64", Progress: "quiet", OutDir: out})
		if err == nil {
			t.Fatal("a broken package built")
		}
		msg := err.Error()
		for _, want := range []string{"[linux/amd64] go build", "pkg/cni/cni.go", "undefinedThing"} {
			if !strings.Contains(msg, want) {
				t.Errorf("error does not mention %q:\n%s", want, msg)
			}
		}
		if strings.Contains(msg, "[antrea-agent") {
			t.Errorf("error mentions other binaries:\n%s", msg)
		}
		if entries, _ := os.ReadDir(out); len(entries) != 0 {
			t.Errorf("a failed build left outputs: %v", entries)
		}
	})
}

func TestUnreachableBuildkitHost(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	addr := "unix:///nonexistent/kiln-test/buildkitd.sock"
	t.Setenv("BUILDKIT_HOST", addr)
	out := t.TempDir()
	_, err := session.Images(context.Background(), session.Options{Root: testdaemon.RepoRoot(t), Progress: "quiet", OutDir: out})
	if err == nil {
		t.Fatal("built without a daemon")
	}
	for _, want := range []string{addr, "BUILDKIT_HOST"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("outputs left behind: %v", entries)
	}
}

// editedCopy copies the checkout and appends a line to one file of it
// (none when file is empty).
func editedCopy(t *testing.T, opts session.Options, file string) session.Options {
	t.Helper()
	dir := t.TempDir()
	testdaemon.CopyTree(t, opts.Root, dir)
	if file != "" {
		line := "\n<!-- edited by a test -->\n"
		if strings.HasSuffix(file, ".go") {
			line = "\nvar editedByATest = 1\n"
		}
		testdaemon.AppendLine(t, filepath.Join(dir, file), line)
	}
	opts.Root, opts.OutDir = dir, t.TempDir()
	return opts
}

func diffText(diffs []inspect.Difference) string {
	var lines []string
	for _, d := range diffs {
		lines = append(lines, d.String())
	}
	return strings.Join(lines, "\n")
}

func sameDigests(t *testing.T, want, got []session.ImageResult) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%d images, then %d", len(want), len(got))
	}
	for i := range want {
		if want[i].Digest != got[i].Digest {
			t.Errorf("%s: digest %s, then %s", want[i].Name, want[i].Digest, got[i].Digest)
		}
	}
}

var machines = map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64": elf.EM_AARCH64, "linux/arm/v7": elf.EM_ARM}

// checkELF asserts the binary targets the platform and is statically linked.
func checkELF(t *testing.T, what string, data []byte, platform string) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Errorf("%s: not an ELF: %v", what, err)
		return
	}
	if want := machines[platform]; f.Machine != want {
		t.Errorf("%s: ELF machine %v, want %v", what, f.Machine, want)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s: has an ELF interpreter: dynamically linked", what)
		}
	}
}

func runBinary(t *testing.T, data []byte, args ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(path, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", path, args, err, out)
	}
	return string(out)
}

// copyTree copies a checkout, .git included, without build outputs.
