// Package ocimerge owns the assembly of one image from parts built apart:
// OCI layout tarballs that each hold some of an image's platforms (as
// daemons that each built some platforms export them) become one layout
// whose index has the bytes BuildKit's exporter writes when one daemon
// builds every platform, so the image's digest does not say where its
// platforms were built.
package ocimerge

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/atomicfile"
)

// Index is the image index BuildKit's image writer makes of these
// platform manifests, in this order (exporter/containerimage's
// ImageWriter.Commit, with no annotations and no attestations): the same
// manifests give the same bytes.
func Index(manifests []ocispec.Descriptor) ([]byte, error) {
	return json.MarshalIndent(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: manifests,
	}, "", "  ")
}

// Merge writes to dest one OCI layout tarball of the image whose platforms
// the parts hold between them, in the order of platforms: every platform in
// exactly one part, and none besides. The tarball is written as BuildKit's
// OCI exporter writes one (containerd's archive exporter, the image names
// of the parts' index.json), whole or not at all. It returns the index's
// descriptor.
func Merge(ctx context.Context, dest string, parts []string, order []ocispec.Platform) (ocispec.Descriptor, error) {
	if len(parts) == 0 {
		return ocispec.Descriptor{}, errors.New("merge: no parts")
	}
	store, err := os.MkdirTemp(filepath.Dir(dest), ".ocimerge-")
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer os.RemoveAll(store)
	byPlatform := map[string]ocispec.Descriptor{}
	var names []string
	var annotations map[string]string
	for i, part := range parts {
		index, partNames, partAnnotations, err := unpack(part, store)
		if err != nil {
			return ocispec.Descriptor{}, err
		}
		if i == 0 {
			names, annotations = partNames, partAnnotations
		} else if !slices.Equal(names, partNames) {
			return ocispec.Descriptor{}, fmt.Errorf("%s names the image %s, %s names it %s", parts[0], strings.Join(names, ", "), part, strings.Join(partNames, ", "))
		} else if !maps.Equal(annotations, partAnnotations) {
			return ocispec.Descriptor{}, fmt.Errorf("%s annotates the image %v, %s %v", parts[0], annotations, part, partAnnotations)
		}
		for _, m := range index.Manifests {
			if m.Platform == nil {
				return ocispec.Descriptor{}, fmt.Errorf("%s: manifest %s has no platform", part, m.Digest)
			}
			p := platforms.FormatAll(platforms.Normalize(*m.Platform))
			if _, ok := byPlatform[p]; ok {
				return ocispec.Descriptor{}, fmt.Errorf("%s: %s is in two parts", part, p)
			}
			byPlatform[p] = m
		}
	}
	var manifests []ocispec.Descriptor
	for _, want := range order {
		p := platforms.FormatAll(platforms.Normalize(want))
		m, ok := byPlatform[p]
		if !ok {
			return ocispec.Descriptor{}, fmt.Errorf("merge: no part holds %s", p)
		}
		delete(byPlatform, p)
		manifests = append(manifests, m)
	}
	for p := range byPlatform {
		return ocispec.Descriptor{}, fmt.Errorf("merge: a part holds %s, which the image does not list", p)
	}
	data, err := Index(manifests)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: digest.FromBytes(data), Size: int64(len(data)), Annotations: annotations}
	if err := os.WriteFile(blobPath(store, desc.Digest), data, 0o444); err != nil {
		return ocispec.Descriptor{}, err
	}
	cs := blobDir(store)
	opts := []archive.ExportOpt{archive.WithManifest(desc, names...), archive.WithAllPlatforms(), archive.WithSkipDockerManifest()}
	err = atomicfile.Write(dest, func(w io.Writer) error { return archive.Export(ctx, cs, w, opts...) })
	return desc, err
}

// unpack copies the blobs of an OCI layout tarball into store, checking
// each against its digest, and returns its image index, and the image's
// names and other annotations in its index.json (the exporter's
// org.opencontainers.image.created).
func unpack(path, store string) (*ocispec.Index, []string, map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, nil, err
	}
	defer f.Close()
	var top ocispec.Index
	seen := false
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		switch {
		case h.Name == ocispec.ImageIndexFile:
			if err := json.NewDecoder(tr).Decode(&top); err != nil {
				return nil, nil, nil, fmt.Errorf("%s: %s: %w", path, ocispec.ImageIndexFile, err)
			}
			seen = true
		case strings.HasPrefix(h.Name, "blobs/sha256/") && h.Typeflag == tar.TypeReg:
			d := digest.NewDigestFromEncoded(digest.SHA256, strings.TrimPrefix(h.Name, "blobs/sha256/"))
			if err := d.Validate(); err != nil {
				return nil, nil, nil, fmt.Errorf("%s: %s: %w", path, h.Name, err)
			}
			if err := copyBlob(tr, store, d); err != nil {
				return nil, nil, nil, fmt.Errorf("%s: %w", path, err)
			}
		}
	}
	if !seen || len(top.Manifests) == 0 {
		return nil, nil, nil, fmt.Errorf("%s: not an OCI layout of an image (no %s naming one)", path, ocispec.ImageIndexFile)
	}
	var names []string
	annotations := map[string]string{}
	for _, m := range top.Manifests {
		if m.Digest != top.Manifests[0].Digest {
			return nil, nil, nil, fmt.Errorf("%s: holds more than one image", path)
		}
		if name := m.Annotations[images.AnnotationImageName]; name != "" {
			names = append(names, name)
		}
		for k, v := range m.Annotations {
			if k != images.AnnotationImageName && k != ocispec.AnnotationRefName {
				annotations[k] = v
			}
		}
	}
	if len(annotations) == 0 {
		annotations = nil
	}
	if top.Manifests[0].MediaType != ocispec.MediaTypeImageIndex {
		return nil, nil, nil, fmt.Errorf("%s: its image is a %s, not an image index", path, top.Manifests[0].MediaType)
	}
	data, err := os.ReadFile(blobPath(store, top.Manifests[0].Digest))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: its index %s: %w", path, top.Manifests[0].Digest, err)
	}
	var index ocispec.Index
	if err := json.Unmarshal(data, &index); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: its index %s: %w", path, top.Manifests[0].Digest, err)
	}
	if len(index.Annotations) > 0 || index.Subject != nil {
		return nil, nil, nil, fmt.Errorf("%s: its index %s carries annotations or a subject, which a merged index would lose", path, top.Manifests[0].Digest)
	}
	return &index, names, annotations, nil
}

// copyBlob writes a blob into store once, refusing bytes that are not its
// digest's.
func copyBlob(r io.Reader, store string, d digest.Digest) error {
	dest := blobPath(store, d)
	if _, err := os.Stat(dest); err == nil {
		return nil // the same digest from another part: the same bytes
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".blob-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), r); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != d.Encoded() {
		return fmt.Errorf("blob %s holds bytes of sha256:%s", d, got)
	}
	return os.Rename(tmp.Name(), dest)
}

func blobPath(store string, d digest.Digest) string {
	return filepath.Join(store, "blobs", d.Algorithm().String(), d.Encoded())
}

// blobDir serves the blobs of a folder laid out as an OCI layout's blobs
// to containerd's archive exporter.
type blobDir string

func (d blobDir) Info(_ context.Context, dgst digest.Digest) (content.Info, error) {
	fi, err := os.Stat(blobPath(string(d), dgst))
	if errors.Is(err, os.ErrNotExist) {
		return content.Info{}, fmt.Errorf("blob %s: %w", dgst, errdefs.ErrNotFound)
	}
	if err != nil {
		return content.Info{}, err
	}
	return content.Info{Digest: dgst, Size: fi.Size()}, nil
}

func (d blobDir) ReaderAt(_ context.Context, desc ocispec.Descriptor) (content.ReaderAt, error) {
	f, err := os.Open(blobPath(string(d), desc.Digest))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("blob %s: %w", desc.Digest, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return sizedFile{f, fi.Size()}, nil
}

type sizedFile struct {
	*os.File
	size int64
}

func (f sizedFile) Size() int64 { return f.size }
