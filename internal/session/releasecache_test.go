package session_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/testdaemon"
	"github.com/kiln-build/kiln/internal/verify/inspect"
)

// TestAReleaseTakesNothingFromTheDaemonsCache: an attacker writes a layer
// cache whose kilnstep is a trojan (it stamps every binary "pwnd") and whose
// binaries carry "pwnd". A build that trusts the cache imports it on a
// runner's daemon, which keeps its records in its local cache. The release
// on that daemon, asked for no cache, runs every step, whatever its key,
// and equals the release made before the daemon saw the cache.
func TestAReleaseTakesNothingFromTheDaemonsCache(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: needs buildkitd") // each subtest would, and the later ones need the first
	}
	ctx := context.Background()
	root := testdaemon.TinyRepo(t, "[linux/amd64]")
	release := session.Options{Root: root, Platforms: "linux/amd64", Progress: "quiet", Stamp: true, Release: true}
	cache := t.TempDir()

	var want *session.ImagesOutcome
	// The shared daemon makes the release to compare with: warm or not,
	// it never sees the cache.
	t.Run("a daemon exports every step's result", func(t *testing.T) {
		testdaemon.Shared(t)
		exporting := release
		exporting.OutDir, exporting.TrustCaches, exporting.CacheTo = t.TempDir(), true, "type=local,dest="+cache+",mode=max"
		var err error
		if want, err = session.Images(ctx, exporting); err != nil {
			t.Fatal(err)
		}
	})
	if want == nil {
		t.FailNow()
	}
	trojan := trojanStepTool(t)
	var tools, binaries int
	tamperLocalCache(t, cache, func(name string, data []byte) ([]byte, bool) {
		switch path.Base(name) {
		case "kilnstep":
			tools++
			return trojan, true
		case "tiny":
			binaries++
			return append(data, "pwnd"...), true
		}
		return nil, false
	})
	if tools == 0 || binaries == 0 {
		t.Fatalf("the exported cache holds %d layers with kilnstep and %d with the binary; want both", tools, binaries)
	}

	t.Run("another imports it, then releases", func(t *testing.T) {
		testdaemon.Buildkit(t)
		trusting := release
		trusting.OutDir, trusting.TrustCaches, trusting.CacheFrom = t.TempDir(), true, "type=local,src="+cache
		got, err := session.Images(ctx, trusting)
		if err != nil {
			t.Fatal(err)
		}
		// BuildKit does not always consult an imported cache for steps fed
		// by local sources (one run in three here): the release is then
		// checked against the records of the trusted build alone.
		if !bytes.Contains(imageFile(t, got.Images[0].Path, "usr/local/bin/tiny"), []byte("pwnd")) {
			t.Logf("this time the build that trusts the poisoned cache did not take it; steps %+v", got.Steps)
		}

		untrusting := release
		untrusting.OutDir = t.TempDir()
		rel, err := session.Images(ctx, untrusting)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(imageFile(t, rel.Images[0].Path, "usr/local/bin/tiny"), []byte("pwnd")) {
			t.Error("the release's binary comes from the poisoned cache")
		}
		if rel.Images[0].Digest != want.Images[0].Digest {
			t.Errorf("the release is %s on the daemon that imported the poisoned cache, %s on one that did not", rel.Images[0].Digest, want.Images[0].Digest)
		}
		var ran int
		for _, st := range rel.Steps {
			// Local sources are sent, whatever the daemon holds.
			if st.Cached && !strings.HasSuffix(st.Name, " archive") && !strings.HasPrefix(st.Name, "[context]") {
				t.Errorf("the release took %q from the daemon's cache", st.Name)
			}
			if !st.Cached {
				ran++
			}
		}
		if ran < 5 {
			t.Errorf("the release ran %d steps: %v", ran, rel.Steps)
		}
	})
}

// trojanStepTool is kilnstep with an init that adds -ldflags stamping
// "pwnd" to every go build it runs.
func trojanStepTool(t *testing.T) []byte {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"main.go", "modules.go"} {
		data, err := os.ReadFile(filepath.Join(testdaemon.RepoRoot(t), "internal", "golang", "kilnstep", name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "main.go" {
			data = append(data, `
func init() {
	if len(os.Args) > 1 && os.Args[1] == "gobuild" {
		for i, a := range os.Args {
			if a == "-o" {
				os.Args = append(os.Args[:i:i], append([]string{"-ldflags=-X=example.com/tiny/pkg/version.Version=pwnd"}, os.Args[i:]...)...)
				break
			}
		}
	}
}
`...)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module trojan\n\ngo 1.26\n"), 0o644)
	bin := filepath.Join(dir, "kilnstep")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the trojan: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// imageFile is the file name as the image's layers leave it.
func imageFile(t *testing.T, layoutPath, name string) []byte {
	t.Helper()
	layout, err := inspect.ReadLayout(layoutPath)
	if err != nil {
		t.Fatal(err)
	}
	var data []byte
	for _, l := range layout.Manifests[0].Layers {
		for _, f := range l.Files {
			if f.Path == name {
				data = f.Data
			}
		}
	}
	if data == nil {
		t.Fatalf("%s: no %s", layoutPath, name)
	}
	return data
}

// tamperLocalCache rewrites the files of the layers of the BuildKit local
// cache at dir for which edit returns true, and every digest, size and
// uncompressed digest that names those layers, the cache's configuration
// and its manifest, as someone who can write the cache would. It returns
// the number of layers rewritten.
func tamperLocalCache(t *testing.T, dir string, edit func(name string, data []byte) ([]byte, bool)) int {
	t.Helper()
	blobs := filepath.Join(dir, "blobs", "sha256")
	entries, err := os.ReadDir(blobs)
	if err != nil {
		t.Fatal(err)
	}
	renamed := map[string]string{} // old digest (or diff ID) to new
	sizes := map[string]int{}      // new digest to size
	put := func(data []byte) string {
		sum := fmt.Sprintf("sha256:%x", sha256.Sum256(data))
		if err := os.WriteFile(filepath.Join(blobs, strings.TrimPrefix(sum, "sha256:")), data, 0o644); err != nil {
			t.Fatal(err)
		}
		sizes[sum] = len(data)
		return sum
	}
	var layers int
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(blobs, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			continue // not a gzip layer
		}
		raw, err := io.ReadAll(zr)
		if err != nil {
			continue
		}
		edited, ok := editTar(t, raw, edit)
		if !ok {
			continue
		}
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		zw.Write(edited)
		zw.Close()
		renamed["sha256:"+e.Name()] = put(z.Bytes())
		renamed[fmt.Sprintf("sha256:%x", sha256.Sum256(raw))] = fmt.Sprintf("sha256:%x", sha256.Sum256(edited))
		layers++
	}
	// The JSON blobs name the layers, and one another: rewrite until none
	// names an old digest.
	for changed := true; changed; {
		changed = false
		for _, e := range entries {
			old := "sha256:" + e.Name()
			if _, done := renamed[old]; done {
				continue
			}
			data, _ := os.ReadFile(filepath.Join(blobs, e.Name()))
			if rewritten, ok := renameDigests(data, renamed, sizes); ok {
				renamed[old] = put(rewritten)
				changed = true
			}
		}
	}
	index := filepath.Join(dir, "index.json")
	data, err := os.ReadFile(index)
	if err != nil {
		t.Fatal(err)
	}
	if rewritten, ok := renameDigests(data, renamed, sizes); ok {
		os.WriteFile(index, rewritten, 0o644)
	} else if layers > 0 {
		t.Fatal("index.json names no rewritten manifest")
	}
	return layers
}

// editTar rewrites the regular files of a tar for which edit returns true.
func editTar(t *testing.T, raw []byte, edit func(name string, data []byte) ([]byte, bool)) ([]byte, bool) {
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	tr := tar.NewReader(bytes.NewReader(raw))
	var found bool
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, false
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, false
		}
		if hdr.Typeflag == tar.TypeReg {
			if edited, ok := edit(strings.TrimPrefix(hdr.Name, "/"), data); ok {
				data, found = edited, true
				hdr.Size = int64(len(data))
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write(data)
	}
	tw.Close()
	return out.Bytes(), found
}

// renameDigests replaces, in a JSON document, every string renamed holds
// and the size beside each digest replaced; false when it names none.
func renameDigests(data []byte, renamed map[string]string, sizes map[string]int) ([]byte, bool) {
	var doc any
	if json.Unmarshal(data, &doc) != nil {
		return nil, false
	}
	var changed bool
	var walk func(v any) any
	walk = func(v any) any {
		switch v := v.(type) {
		case string:
			if to, ok := renamed[v]; ok {
				changed = true
				return to
			}
		case []any:
			for i := range v {
				v[i] = walk(v[i])
			}
		case map[string]any:
			for k := range v {
				v[k] = walk(v[k])
			}
			if d, ok := v["digest"].(string); ok {
				if size, ok := sizes[d]; ok {
					if _, has := v["size"]; has {
						v["size"] = size
					}
				}
			}
		}
		return v
	}
	doc = walk(doc)
	if !changed {
		return nil, false
	}
	out, err := json.Marshal(doc)
	return out, err == nil
}
