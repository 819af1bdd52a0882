package session_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/gocache"
	"github.com/kiln-build/kiln/internal/modfixture"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/sign"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// compiledRE finds the packages go -x compiled (main packages compile as -p main).
var compiledRE = regexp.MustCompile(`/compile -o \S+ .*?-p (\S+) `)

func compiled(progress string) []string {
	seen := map[string]bool{}
	for _, m := range compiledRE.FindAllStringSubmatch(progress, -1) {
		seen[m[1]] = true
	}
	return slices.Sorted(func(yield func(string) bool) {
		for p := range seen {
			if !yield(p) {
				return
			}
		}
	})
}

func TestGoCacheSnapshotAcrossDaemons(t *testing.T) {
	reg := testdaemon.StartRegistry(t)
	repo := reg.Addr + "/kiln/gocache"
	fixture := t.TempDir()
	modfixture.Write(t, fixture, map[string]string{
		"go.mod":        "module example.com/snap\n\ngo 1.26\n",
		"cmd/a/main.go": "package main\n\nimport (\n\t\"os\"\n\n\t\"example.com/snap/x\"\n)\n\nfunc main() { os.Stdout.WriteString(x.Name() + \"\\n\") }\n",
		"cmd/b/main.go": "package main\n\nimport (\n\t\"os\"\n\n\t\"example.com/snap/y\"\n)\n\nfunc main() { os.Stdout.WriteString(y.Name() + \"\\n\") }\n",
		"x/x.go":        "package x\n\nimport (\n\t\"strings\"\n\n\t\"example.com/snap/y\"\n)\n\nfunc Name() string { return strings.ToUpper(\"x on \") + y.Name() }\n",
		"y/y.go":        "package y\n\nimport \"strconv\"\n\nfunc Name() string { return \"y\" + strconv.Itoa(1) }\n",
	})
	// New to the shared daemon however often the test runs (-count).
	for _, f := range []string{"x/x.go", "y/y.go"} {
		testdaemon.AppendLine(t, filepath.Join(fixture, f), fmt.Sprintf("\n// run %d\n", time.Now().UnixNano()))
	}
	opts := session.Options{Root: testdaemon.RepoRoot(t), Module: fixture, Packages: []string{"./cmd/a", "./cmd/b"},
		Platforms: "linux/amd64", Progress: "plain", TraceCompiles: true}
	runIn := func(ctx context.Context, t *testing.T, o session.Options) (*session.BinariesOutcome, string) {
		t.Helper()
		var progress bytes.Buffer
		o.OutDir, o.ProgressOut = t.TempDir(), &progress
		out, err := session.Binaries(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		return out, progress.String()
	}
	run := func(t *testing.T, o session.Options) (*session.BinariesOutcome, string) {
		return runIn(context.Background(), t, o)
	}

	pub, priv := keyPair(t)
	var published *gocache.Result
	t.Run("daemon A publishes, signed", func(t *testing.T) {
		testdaemon.Shared(t)
		t.Setenv(gocache.SigningKeyEnv, priv)
		o := opts
		o.GoCacheTo = repo
		out, progress := run(t, o)
		if out.GoCache == nil || len(out.GoCache.Refs) != 2 || !out.GoCache.Signed {
			t.Fatalf("no signed snapshot published: %+v", out.GoCache)
		}
		if got := compiled(progress); !slices.Contains(got, "example.com/snap/x") || !slices.Contains(got, "example.com/snap/y") {
			t.Fatalf("the build on A did not compile the module's packages? compiled %v", got)
		}
		published = out.GoCache
		// One key story: the snapshot's signature is cosign's.
		cosign := exec.Command(testdaemon.Cosign(t), "verify", "--key", pub, "--insecure-ignore-tlog", published.Refs[0])
		if out, err := cosign.CombinedOutput(); err != nil {
			t.Errorf("cosign verify --key of the published snapshot: %v\n%s", err, out)
		}
	})
	if published == nil {
		t.FailNow()
	}
	tag := strings.TrimPrefix(published.Refs[0], repo+":")
	_, _, body, err := reg.Manifest("kiln/gocache", tag)
	if err != nil {
		t.Fatalf("the snapshot is not in the registry: %v", err)
	}
	var manifest struct {
		Layers []struct{ Digest, MediaType string }
	}
	if err := json.Unmarshal(body, &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("snapshot manifest %s: %v", body, err)
	}
	original, err := reg.Blob("kiln/gocache", manifest.Layers[0].Digest)
	if err != nil {
		t.Fatal(err)
	}

	// An edit to x: only x and its dependent main package may compile on B.
	xfile := filepath.Join(fixture, "x", "x.go")
	dt, _ := os.ReadFile(xfile)
	os.WriteFile(xfile, bytes.Replace(dt, []byte("x on "), []byte("edited x on "), 1), 0o644)

	var clean []byte
	t.Run("fresh daemon B checks the signature and compiles only the edited package", func(t *testing.T) {
		testdaemon.Buildkit(t)
		realCache, _ := buildkit.CacheDir()
		freshKilnCache(t) // no snapshot fetched before
		o := opts
		o.GoCacheFrom, o.GoCacheKey = repo, pub
		out, progress := run(t, o)
		// B built kilnstep from nothing; the machine's was built by A or
		// by an earlier daemon.
		cache, _ := buildkit.CacheDir()
		for _, built := range keptStepTools(t, cache) {
			mine, _ := os.ReadFile(built)
			theirs, err := os.ReadFile(filepath.Join(realCache, "kilnstep", filepath.Base(filepath.Dir(built)), "kilnstep"))
			if err != nil || !bytes.Equal(mine, theirs) {
				t.Errorf("kilnstep built on a fresh daemon differs from the one kept before (%v)", err)
			}
		}
		if len(keptStepTools(t, cache)) != 1 {
			t.Errorf("the build on B kept %v, want one kilnstep", keptStepTools(t, cache))
		}
		clean, _ = os.ReadFile(filepath.Join(out.Dir, "linux_amd64", "a"))
		if got := compiled(progress); !slices.Equal(got, []string{"example.com/snap/x", "main"}) {
			t.Errorf("daemon B compiled %v; want example.com/snap/x and its main package only", got)
		}
		if len(out.Ran("seed GOCACHE")) != 1 {
			t.Errorf("the seed step did not run: %v", out.Steps)
		}
		got, err := exec.Command(filepath.Join(out.Dir, "linux_amd64", "a")).Output()
		if err != nil || strings.TrimSpace(string(got)) != "EDITED X ON y1" {
			t.Errorf("a printed %q (%v)", got, err)
		}
	})

	t.Run("a corrupted snapshot is rejected and the build succeeds", func(t *testing.T) {
		blob := reg.BlobPath(manifest.Layers[0].Digest)
		data, err := os.ReadFile(blob)
		if err != nil {
			t.Fatal(err)
		}
		data[len(data)/2] ^= 0xff
		if err := os.WriteFile(blob, data, 0o644); err != nil {
			t.Fatal(err)
		}
		testdaemon.Buildkit(t)
		freshKilnCacheWithStepTool(t)
		logger, hook := logtest.NewNullLogger()
		ctx := log.WithLogger(context.Background(), logrus.NewEntry(logger))
		o := opts
		o.GoCacheFrom, o.GoCacheUnsigned = repo, true
		out, progress := runIn(ctx, t, o)
		var logs strings.Builder
		for _, e := range hook.AllEntries() {
			logs.WriteString(e.Level.String() + ": " + e.Message + "\n")
		}
		if !strings.Contains(logs.String(), "warning: Go cache snapshot rejected") || !strings.Contains(logs.String(), "does not match its digest") {
			t.Errorf("no rejection was reported; kiln logged:\n%s", logs.String())
		}
		if len(out.Ran("seed")) != 0 || !slices.Contains(compiled(progress), "example.com/snap/y") {
			t.Error("the build used the corrupted snapshot")
		}
		got, err := exec.Command(filepath.Join(out.Dir, "linux_amd64", "a")).Output()
		if err != nil || strings.TrimSpace(string(got)) != "EDITED X ON y1" {
			t.Errorf("a printed %q (%v)", got, err)
		}
	})

	t.Run("a planted snapshot reaches neither the shared cache nor a release; a pinned key refuses it", func(t *testing.T) {
		planted := plant(t, original, manifest.Layers[0].MediaType)
		var tags []string
		for _, ref := range published.Refs {
			tags = append(tags, strings.TrimPrefix(ref, repo+":"))
		}
		reg.PushLayer(t, "kiln/gocache", tags, planted)
		// And replays the real snapshot's signature beside it.
		plantedDigest, _, _, err := reg.Manifest("kiln/gocache", tags[0])
		if err != nil {
			t.Fatal(err)
		}
		_, sigType, sigManifest, err := reg.Manifest("kiln/gocache", strings.Replace(published.Digest, ":", "-", 1)+".sig")
		if err != nil {
			t.Fatalf("the published snapshot has no cosign signature: %v", err)
		}
		reg.PutManifest(t, "kiln/gocache", strings.Replace(plantedDigest, ":", "-", 1)+".sig", sigType, sigManifest)
		testdaemon.Buildkit(t)
		freshKilnCacheWithStepTool(t)
		binaryOf := func(out *session.BinariesOutcome) []byte {
			data, _ := os.ReadFile(filepath.Join(out.Dir, "linux_amd64", "a"))
			return data
		}

		o := opts
		o.GoCacheFrom, o.OutDir = repo, t.TempDir()
		if _, err := session.Binaries(context.Background(), o); err == nil || !strings.Contains(err.Error(), "gocacheUnsigned") {
			t.Fatalf("an unsigned snapshot was seeded without the opt-in: %v", err)
		}
		o.GoCacheUnsigned = true
		poisoned, err := session.Binaries(context.Background(), o)
		if err == nil && (len(poisoned.Ran("seed GOCACHE")) != 1 || bytes.Equal(binaryOf(poisoned), clean)) {
			t.Fatal("the planted snapshot was not used or changed nothing: this test would prove nothing")
		}

		out, _ := run(t, opts)
		if !bytes.Equal(binaryOf(out), clean) {
			t.Error("after a build seeded from the planted snapshot, a plain build on the same daemon differs from a clean daemon's")
		}

		release := opts
		release.GoCacheFrom, release.Release = repo, true
		out, _ = run(t, release)
		if len(out.Ran("seed")) != 0 || !bytes.Equal(binaryOf(out), clean) {
			t.Errorf("a release build seeded from the snapshot (%v) or differs from a clean build", out.Ran("seed"))
		}

		logger, hook := logtest.NewNullLogger()
		ctx := log.WithLogger(context.Background(), logrus.NewEntry(logger))
		pinned := opts
		pinned.GoCacheFrom, pinned.GoCacheKey = repo, pub
		out, _ = runIn(ctx, t, pinned)
		var logs strings.Builder
		for _, e := range hook.AllEntries() {
			logs.WriteString(e.Message + "\n")
		}
		if len(out.Ran("seed")) != 0 || !strings.Contains(logs.String(), "no signature in") || !strings.Contains(logs.String(), "names this digest") {
			t.Errorf("with a pinned key the planted snapshot was not refused; kiln logged:\n%s", logs.String())
		}
	})
}

// freshKilnCache gives the test an empty KILN_CACHE_DIR with the real
// cache's toolchain and buildkitd linked in, so nothing is downloaded again;
// kilnstep is left out, so the first build on it builds kilnstep.
func freshKilnCache(t *testing.T) {
	t.Helper()
	testdaemon.Toolchain(t)
	real, err := buildkit.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, sub := range []string{"bin", "toolchain"} {
		os.Symlink(filepath.Join(real, sub), filepath.Join(dir, sub))
	}
	t.Setenv("KILN_CACHE_DIR", dir)
}

// freshKilnCacheWithStepTool is freshKilnCache with a copy of each kilnstep
// the real cache keeps, as on a machine where a build ran before (daemon A's
// did; B's subtest compares that one with a kilnstep built from nothing): a
// test that is not about building kilnstep need not build it again. Copies,
// not links: kiln takes only a folder of its own holding a plain executable
// file (keptStepTool). A build that still built one fails the test, which
// would otherwise only be slower.
func freshKilnCacheWithStepTool(t *testing.T) {
	t.Helper()
	real, err := buildkit.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	freshKilnCache(t)
	cache, err := buildkit.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	var copied []string
	for _, src := range keptStepTools(t, real) {
		key := filepath.Base(filepath.Dir(src))
		if strings.Contains(key, ".") { // a staging or set-aside folder
			continue
		}
		if !session.KeptStepTool(filepath.Dir(src)) {
			continue
		}
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(cache, "kilnstep", key, "kilnstep")
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			t.Fatal(err)
		}
		// With the record of its sha256, as the build that made it left it.
		sum, err := os.ReadFile(filepath.Join(filepath.Dir(src), "kilnstep.sha256"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(filepath.Dir(dst), "kilnstep.sha256"), sum, 0o644); err != nil {
			t.Fatal(err)
		}
		copied = append(copied, dst)
	}
	if len(copied) == 0 {
		t.Fatalf("%s keeps no kilnstep to copy; daemon A's build should have left one", real)
	}
	t.Cleanup(func() {
		if got := keptStepTools(t, cache); !slices.Equal(got, copied) {
			t.Errorf("the cache keeps %v after the build, not just the copied %v: kilnstep was built again", got, copied)
		}
	})
}

// keyPair writes a cosign key pair (cosign.key, cosign.pub), the private
// key encrypted with the password KILN_GOCACHE_SIGNING_PASSWORD gives, and
// returns their paths.
func keyPair(t *testing.T) (pub, priv string) {
	t.Helper()
	sk, pk, err := sign.GenerateKeyPair([]byte("snapshot-pass"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pub, priv = filepath.Join(dir, "cosign.pub"), filepath.Join(dir, "cosign.key")
	os.WriteFile(pub, pk, 0o644)
	os.WriteFile(priv, sk, 0o600)
	t.Setenv(gocache.SigningPasswordEnv, "snapshot-pass")
	return pub, priv
}

// plant rewrites a snapshot layer the way a writer to the cache registry
// could: every action now maps to the output of another action. Each output
// still hashes to its name and each action names an output the snapshot
// holds, so the snapshot passes every integrity check.
func plant(t *testing.T, layer []byte, mediaType string) []byte {
	t.Helper()
	var r io.Reader = bytes.NewReader(layer)
	if strings.HasSuffix(mediaType, "gzip") {
		zr, err := gzip.NewReader(r)
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	}
	type entry struct {
		h    *tar.Header
		data []byte
	}
	var entries []entry
	var target, targetSize string
	largest := 0
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		entries = append(entries, entry{h, data})
		if strings.HasSuffix(h.Name, "-d") && len(data) > largest {
			target, targetSize, largest = strings.TrimSuffix(filepath.Base(h.Name), "-d"), strconv.Itoa(len(data)), len(data)
		}
	}
	if target == "" {
		t.Fatal("no output to plant")
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for _, e := range entries {
		if strings.HasSuffix(e.h.Name, "-a") {
			// The go command reads only entries of its exact fixed-width form.
			f := strings.Fields(string(e.data))
			size, _ := strconv.Atoi(targetSize)
			ts, _ := strconv.ParseInt(f[4], 10, 64)
			e.data = fmt.Appendf(nil, "v1 %s %s %20d %20d\n", f[1], target, size, ts)
			e.h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(e.h); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.data)
	}
	tw.Close()
	return out.Bytes()
}

// TestUnsignedSnapshotsAreSeededOnlyWhenAskedAndNeverRepublishedSigned:
// without a pinned key a snapshot is whatever its registry's writers
// pushed: seeding one needs cache.gocacheUnsigned, and a build seeded so
// never signs what it publishes. Both are refused before any daemon.
func TestUnsignedSnapshotsAreSeededOnlyWhenAskedAndNeverRepublishedSigned(t *testing.T) {
	t.Setenv("BUILDKIT_HOST", "unix:///nonexistent/kiln-test/buildkitd.sock") // never reached
	opts := session.Options{Root: testdaemon.RepoRoot(t), OutDir: t.TempDir(), Progress: "quiet", GoCacheFrom: "localhost:5000/kiln/gocache"}
	if _, err := session.Binaries(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "gocacheUnsigned") || strings.Contains(err.Error(), "BUILDKIT_HOST") {
		t.Errorf("seeding an unsigned snapshot unasked: %v; want it refused before any daemon, naming cache.gocacheUnsigned", err)
	}
	_, priv := keyPair(t)
	t.Setenv(gocache.SigningKeyEnv, priv)
	opts.GoCacheUnsigned, opts.GoCacheTo = true, "localhost:5000/kiln/gocache"
	if _, err := session.Binaries(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "never published signed") || strings.Contains(err.Error(), "BUILDKIT_HOST") {
		t.Errorf("publishing signed after seeding unsigned: %v; want it refused before any daemon", err)
	}
}
