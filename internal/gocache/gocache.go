// Package gocache owns Go build cache snapshots, the stage that carries
// compiled packages from one BuildKit daemon to another through a registry.
// BuildKit never exports cache mounts, so kiln copies the entries a build
// used out of its GOCACHE mount (golang.Graph.Snapshot) and pushes them as a
// one-layer OCI image. On another daemon this package fetches the best
// matching snapshot, checks every byte of it, and golang.Graph.Seed adds its
// entries before anything compiles. A snapshot is never needed for
// correctness: a missing or corrupt one only makes the build slower.
package gocache

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/sign"
)

// DefaultMax is the largest snapshot kiln publishes or fetches.
const DefaultMax = 2 << 30

// maxEntries caps the files of a snapshot: two per compiled package, and
// a large build compiles a few thousand.
const maxEntries = 1 << 18

// Tags are the tags a build's snapshot is pushed under, best match first:
// one for this toolchain, build platform, Go environment, targets (the
// plan's platforms, unless targets names others) and module files, and
// one for the same without the module files (any commit of the project,
// for a build whose go.sum changed).
func Tags(p *plan.Plan, targets []string) []string {
	if targets == nil {
		targets = p.PlatformIDs()
	}
	base := sha256.New()
	fmt.Fprintf(base, "toolchain %s\nbuild %s\n", p.Toolchain.SHA256, config.FormatPlatform(p.BuildPlatform))
	fmt.Fprintf(base, "env %q\nargs %q\ntargets %q\n", p.GoEnv.Env, compileArgs(p.GoEnv.BuildArgs), targets)
	exact := sha256.New()
	exact.Write(base.Sum(nil))
	for _, f := range p.ModFiles {
		fmt.Fprintf(exact, "%s %s\n", f, p.ModFileHashes[f])
	}
	prefix := fmt.Sprintf("go%s-%s-%s-", p.Toolchain.GoVersion, p.BuildPlatform.OS, p.BuildPlatform.Architecture)
	return []string{
		prefix + hex.EncodeToString(exact.Sum(nil))[:16],
		prefix + hex.EncodeToString(base.Sum(nil))[:16] + "-any",
	}
}

// compileArgs drops -ldflags: the link flags (the stamp) change no package.
func compileArgs(args []string) []string {
	var out []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-ldflags=") {
			out = append(out, a)
		}
	}
	return out
}

// Snapshot is a fetched and verified snapshot on this machine.
type Snapshot struct {
	Ref     string // repository:tag it came from
	Digest  string // its layer's digest
	Dir     string // its entries
	Entries int
	Bytes   int64
}

// FetchOptions say how to reach the registry.
type FetchOptions struct {
	// PlainHTTP uses http instead of https.
	PlainHTTP bool
	// Credentials returns the user and secret for a registry host.
	Credentials func(host string) (string, string, error)
	// Max is the largest snapshot accepted, in bytes; DefaultMax when 0.
	Max int64
	// Verifier, when set, holds the only key a snapshot may be signed
	// with; an unsigned or wrongly signed snapshot is refused before
	// download.
	Verifier *sign.Verifier
}

func newResolver(opts FetchOptions) remotes.Resolver {
	return buildkit.Resolver(opts.PlainHTTP, false, opts.Credentials)
}

// ErrNotFound means no tag of the repository holds a snapshot.
var ErrNotFound = errors.New("no snapshot for this toolchain and Go environment")

// Fetch finds the first of tags in repo, downloads its layer into cacheDir,
// and verifies it. Every error leaves nothing behind.
func Fetch(ctx context.Context, repo string, tags []string, cacheDir string, opts FetchOptions) (*Snapshot, error) {
	if opts.Max == 0 {
		opts.Max = DefaultMax
	}
	resolver := newResolver(opts)
	var lastErr error = ErrNotFound
	for _, tag := range tags {
		ref := repo + ":" + tag
		name, desc, err := resolver.Resolve(ctx, ref)
		if err != nil {
			if !errdefs.IsNotFound(err) {
				lastErr = fmt.Errorf("%s: %w", ref, err)
			}
			continue
		}
		fetcher, err := resolver.Fetcher(ctx, name)
		if err != nil {
			return nil, err
		}
		layer, err := snapshotLayer(ctx, fetcher, desc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
		if layer.Size > opts.Max {
			return nil, fmt.Errorf("%s: the snapshot is %d bytes, over the cap of %d", ref, layer.Size, opts.Max)
		}
		// A cosign signature of the manifest, which names the layer by
		// its digest: `cosign verify --key cosign.pub REF` checks the same.
		if opts.Verifier != nil {
			if err := opts.Verifier.VerifyImage(ctx, resolver, repo, desc.Digest); err != nil {
				return nil, fmt.Errorf("%s: %w; it must be signed with the key cache.gocacheKey pins", ref, err)
			}
		}
		s, err := download(ctx, fetcher, layer, cacheDir, opts.Max)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
		s.Ref = ref
		return s, nil
	}
	return nil, lastErr
}

// snapshotLayer reads the manifest (or the one manifest of an index) and
// returns its single layer.
func snapshotLayer(ctx context.Context, f remotes.Fetcher, desc ocispec.Descriptor) (ocispec.Descriptor, error) {
	for range 2 {
		dt, err := buildkit.ReadBlob(ctx, f, desc, 4<<20)
		if err != nil {
			return ocispec.Descriptor{}, err
		}
		var m struct {
			MediaType string               `json:"mediaType"`
			Manifests []ocispec.Descriptor `json:"manifests"`
			Layers    []ocispec.Descriptor `json:"layers"`
		}
		if err := json.Unmarshal(dt, &m); err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("manifest %s: %w", desc.Digest, err)
		}
		if len(m.Manifests) > 0 {
			desc = m.Manifests[0]
			continue
		}
		if len(m.Layers) != 1 {
			return ocispec.Descriptor{}, fmt.Errorf("manifest %s has %d layers; a Go cache snapshot has one", desc.Digest, len(m.Layers))
		}
		return m.Layers[0], nil
	}
	return ocispec.Descriptor{}, fmt.Errorf("index %s nests indexes; not a Go cache snapshot", desc.Digest)
}

// download unpacks the layer into cacheDir/gocache/<digest>, checking the
// layer's digest and every entry before the directory gets its final name.
func download(ctx context.Context, f remotes.Fetcher, layer ocispec.Descriptor, cacheDir string, max int64) (*Snapshot, error) {
	dir := filepath.Join(cacheDir, "gocache", layer.Digest.Encoded())
	s := &Snapshot{Digest: layer.Digest.String(), Dir: dir}
	if n, size, err := Verify(dir); err == nil {
		s.Entries, s.Bytes = n, size
		return s, nil // fetched and verified before
	}
	rc, err := f.Fetch(ctx, layer)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "fetch-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	// The whole blob is checked against its digest before a byte is unpacked.
	blob, err := os.CreateTemp(filepath.Dir(dir), "blob-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(blob.Name())
	defer blob.Close()
	verifier := layer.Digest.Verifier()
	if _, err := io.Copy(io.MultiWriter(blob, verifier), io.LimitReader(rc, layer.Size+1)); err != nil {
		return nil, fmt.Errorf("download layer %s: %w", layer.Digest, err)
	}
	if !verifier.Verified() {
		return nil, fmt.Errorf("layer %s does not match its digest: corrupt in the registry or in transit", layer.Digest)
	}
	if _, err := blob.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	if err := untar(blob, layer.MediaType, tmp, max); err != nil {
		return nil, fmt.Errorf("unpack layer %s: %w", layer.Digest, err)
	}
	root := tmp
	if _, err := os.Stat(filepath.Join(tmp, "gocache")); err == nil {
		root = filepath.Join(tmp, "gocache")
	}
	n, size, err := Verify(root)
	if err != nil {
		return nil, err
	}
	os.RemoveAll(dir)
	if err := os.Rename(root, dir); err != nil {
		return nil, err
	}
	s.Entries, s.Bytes = n, size
	return s, nil
}

func untar(r io.Reader, mediaType, dir string, max int64) error {
	if strings.HasSuffix(mediaType, "gzip") {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	}
	tr := tar.NewReader(r)
	var total int64
	for entries := 0; ; entries++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if entries >= maxEntries {
			return fmt.Errorf("more than %d entries; not a Go cache snapshot kiln wrote", maxEntries)
		}
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("entry %q leaves the snapshot", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if total += h.Size; total > max {
				return fmt.Errorf("the snapshot unpacks to more than %d bytes", max)
			}
			path := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			out, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q is not a regular file", h.Name)
		}
	}
}

// Verify checks a snapshot directory as go's cache would need it: every
// output file (<xx>/<id>-d) hashes to its name, and every action file
// (<xx>/<id>-a) names itself and an output of the size it records. It
// returns the number of actions and the bytes.
func Verify(dir string) (int, int64, error) {
	outputs := map[string]int64{}
	var actions []string
	var total int64
	err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if fi.IsDir() {
			if rel != "." && (len(rel) != 2 || !isHex(rel)) {
				return fmt.Errorf("unexpected directory %s", rel)
			}
			return nil
		}
		base := filepath.Base(rel)
		if len(base) != 66 || !isHex(base[:64]) || filepath.Dir(rel) != base[:2] {
			return fmt.Errorf("unexpected file %s", rel)
		}
		total += fi.Size()
		switch base[64:] {
		case "-d":
			dt, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if sum := sha256.Sum256(dt); hex.EncodeToString(sum[:]) != base[:64] {
				return fmt.Errorf("output %s does not hash to its name", rel)
			}
			outputs[base[:64]] = fi.Size()
		case "-a":
			actions = append(actions, path)
		default:
			return fmt.Errorf("unexpected file %s", rel)
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("corrupt Go cache snapshot: %w", err)
	}
	for _, path := range actions {
		dt, err := os.ReadFile(path)
		if err != nil {
			return 0, 0, err
		}
		f := strings.Fields(string(dt))
		id := strings.TrimSuffix(filepath.Base(path), "-a")
		if len(f) < 4 || f[0] != "v1" || f[1] != id {
			return 0, 0, fmt.Errorf("corrupt Go cache snapshot: action %s is malformed", id)
		}
		size, err := strconv.ParseInt(f[3], 10, 64)
		if got, ok := outputs[f[2]]; err != nil || !ok || got != size {
			return 0, 0, fmt.Errorf("corrupt Go cache snapshot: action %s names output %s of %s bytes, which the snapshot does not hold", id, f[2], f[3])
		}
	}
	if len(actions) == 0 {
		return 0, 0, fmt.Errorf("corrupt Go cache snapshot: no entries")
	}
	return len(actions), total, nil
}

func isHex(s string) bool {
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return s != ""
}
