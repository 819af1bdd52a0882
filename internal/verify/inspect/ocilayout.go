package inspect

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Layout is an OCI layout tarball as kiln exports it: one image index with
// one manifest per platform.
type Layout struct {
	Path        string
	IndexDigest string
	Index       ocispec.Index
	Manifests   []Manifest
}

// Manifest is one platform's image.
type Manifest struct {
	Platform string
	Digest   string
	Manifest ocispec.Manifest
	Config   ocispec.Image
	// ConfigRaw is the config blob as stored.
	ConfigRaw []byte
	Layers    []Layer
}

// Layer is one layer with its files.
type Layer struct {
	Digest string
	Files  []File
}

// File is one entry of a layer.
type File struct {
	Path    string
	Mode    int64
	UID     int
	GID     int
	Size    int64
	ModTime time.Time
	Type    byte
	SHA256  string
	Data    []byte // regular files only
}

// File returns the file at path (no leading slash) from the top-most layer.
func (m *Manifest) File(path string) (File, bool) {
	for i := len(m.Layers) - 1; i >= 0; i-- {
		for _, f := range m.Layers[i].Files {
			if f.Path == path {
				return f, true
			}
		}
	}
	return File{}, false
}

// ReadLayout reads and parses an OCI layout tarball.
func ReadLayout(path string) (*Layout, error) {
	blobs, err := readTar(path, func(*tar.Header) bool { return true })
	if err != nil {
		return nil, err
	}
	return LayoutFromBlobs(path, blobs)
}

// readTar holds the entries of the tarball at path that keep accepts, by
// name.
func readTar(path string, keep func(*tar.Header) bool) (map[string][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return entries, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: not an OCI layout tarball: %w", path, err)
		}
		if !keep(h) {
			continue
		}
		if entries[h.Name], err = io.ReadAll(tr); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
}

// LayoutFromBlobs reads an OCI layout held in memory: "index.json" and
// "blobs/<alg>/<hex>" entries. name names it in errors.
func LayoutFromBlobs(path string, blobs map[string][]byte) (*Layout, error) {
	blob := func(dgst string, v any) ([]byte, error) {
		data, ok := blobs["blobs/"+strings.Replace(dgst, ":", "/", 1)]
		if !ok {
			return nil, fmt.Errorf("%s: blob %s missing", path, dgst)
		}
		if sum := sha256.Sum256(data); "sha256:"+hex.EncodeToString(sum[:]) != dgst {
			return nil, fmt.Errorf("%s: blob %s does not match its digest", path, dgst)
		}
		if v != nil {
			if err := json.Unmarshal(data, v); err != nil {
				return nil, fmt.Errorf("%s: blob %s: %w", path, dgst, err)
			}
		}
		return data, nil
	}
	var top ocispec.Index
	if err := json.Unmarshal(blobs["index.json"], &top); err != nil || len(top.Manifests) != 1 {
		return nil, fmt.Errorf("%s: index.json must name exactly one image index", path)
	}
	l := &Layout{Path: path, IndexDigest: top.Manifests[0].Digest.String()}
	if _, err := blob(l.IndexDigest, &l.Index); err != nil {
		return nil, err
	}
	for _, desc := range l.Index.Manifests {
		m := Manifest{Digest: desc.Digest.String()}
		if desc.Platform != nil {
			m.Platform = platforms.Format(*desc.Platform)
		}
		if _, err := blob(m.Digest, &m.Manifest); err != nil {
			return nil, err
		}
		raw, err := blob(m.Manifest.Config.Digest.String(), &m.Config)
		if err != nil {
			return nil, err
		}
		m.ConfigRaw = raw
		for _, ld := range m.Manifest.Layers {
			data, err := blob(ld.Digest.String(), nil)
			if err != nil {
				return nil, err
			}
			files, err := readLayer(data)
			if err != nil {
				return nil, fmt.Errorf("%s: layer %s: %w", path, ld.Digest, err)
			}
			m.Layers = append(m.Layers, Layer{Digest: ld.Digest.String(), Files: files})
		}
		l.Manifests = append(l.Manifests, m)
	}
	return l, nil
}

// readLayer lists a layer's files, whatever its compression: a base image
// may carry gzip, zstd or uncompressed layers (containerd's
// DecompressStream tells them by their first bytes).
func readLayer(data []byte) ([]File, error) {
	zr, err := compression.DecompressStream(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	var files []File
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		} else if err != nil {
			return nil, err
		}
		f := File{Path: strings.TrimSuffix(h.Name, "/"), Mode: h.Mode, UID: h.Uid, GID: h.Gid, Size: h.Size, ModTime: h.ModTime, Type: h.Typeflag}
		if h.Typeflag == tar.TypeReg {
			if f.Data, err = io.ReadAll(tr); err != nil {
				return nil, err
			}
			sum := sha256.Sum256(f.Data)
			f.SHA256 = hex.EncodeToString(sum[:])
		}
		files = append(files, f)
	}
}

// PlatformDigest is one platform's manifest in an image index.
type PlatformDigest struct {
	Platform string `json:"platform"`
	Digest   string `json:"digest"`
}

// IndexManifests lists the platform manifests of the one image index in
// the OCI layout tarball at path, in index order. It keeps only index.json
// and the small blobs, so a large image costs a read of the file.
func IndexManifests(path string) ([]PlatformDigest, error) {
	small, err := readTar(path, func(h *tar.Header) bool {
		name := strings.TrimPrefix(h.Name, "./")
		return h.Typeflag == tar.TypeReg && h.Size <= 1<<20 && (name == "index.json" || strings.HasPrefix(name, "blobs/sha256/"))
	})
	if err != nil {
		return nil, err
	}
	for name, data := range small {
		small[strings.TrimPrefix(name, "./")] = data
	}
	var layout, index ocispec.Index
	if err := json.Unmarshal(small["index.json"], &layout); err != nil || len(layout.Manifests) != 1 {
		return nil, fmt.Errorf("%s: not an OCI layout of one image index", path)
	}
	if err := json.Unmarshal(small["blobs/sha256/"+layout.Manifests[0].Digest.Encoded()], &index); err != nil {
		return nil, fmt.Errorf("%s: the image index %s: %v", path, layout.Manifests[0].Digest, err)
	}
	var out []PlatformDigest
	for _, m := range index.Manifests {
		if m.Platform != nil {
			out = append(out, PlatformDigest{Platform: platforms.Format(*m.Platform), Digest: m.Digest.String()})
		}
	}
	return out, nil
}
