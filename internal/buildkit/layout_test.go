package buildkit

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// TestOnlyAnIntactLayoutStandsForTheExport: a tarball is kept in place of
// the export only when every blob holds its digest's bytes and every blob
// the index reaches is there; a flipped byte in a layer whose index.json
// still parses, or a missing layer, is exported again.
func TestOnlyAnIntactLayoutStandsForTheExport(t *testing.T) {
	layer := bytes.Repeat([]byte("layer bytes "), 1000)
	config := []byte(`{"architecture":"amd64","os":"linux"}`)
	desc := func(mt string, data []byte) ocispec.Descriptor {
		return ocispec.Descriptor{MediaType: mt, Digest: digest.FromBytes(data), Size: int64(len(data))}
	}
	manifest, _ := json.Marshal(ocispec.Manifest{Config: desc(ocispec.MediaTypeImageConfig, config), Layers: []ocispec.Descriptor{desc(ocispec.MediaTypeImageLayer, layer)}})
	imageIndex, _ := json.Marshal(ocispec.Index{Manifests: []ocispec.Descriptor{desc(ocispec.MediaTypeImageManifest, manifest)}})
	top := desc(ocispec.MediaTypeImageIndex, imageIndex)
	layoutIndex, _ := json.Marshal(ocispec.Index{Manifests: []ocispec.Descriptor{top}})
	write := func(name string, blobs map[string][]byte) string {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, f := range []struct {
			name string
			data []byte
		}{{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)}, {"index.json", layoutIndex}} {
			tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg})
			tw.Write(f.data)
		}
		for _, data := range [][]byte{imageIndex, manifest, config, layer} {
			name := "blobs/sha256/" + digest.FromBytes(data).Encoded()
			if b, ok := blobs[name]; ok {
				if b == nil {
					continue
				}
				data = b
			}
			tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg})
			tw.Write(data)
		}
		tw.Close()
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	layerBlob := "blobs/sha256/" + digest.FromBytes(layer).Encoded()
	if got := intactLayoutDigest(write("intact.tar", nil)); got != top.Digest.String() {
		t.Fatalf("an intact layout: %q, want %s", got, top.Digest)
	}
	flipped := bytes.Clone(layer)
	flipped[len(flipped)/2] ^= 1
	if got := intactLayoutDigest(write("flipped.tar", map[string][]byte{layerBlob: flipped})); got != "" {
		t.Errorf("a layout with a flipped byte in a layer stood for the export (%s)", got)
	}
	if got := intactLayoutDigest(write("missing.tar", map[string][]byte{layerBlob: nil})); got != "" {
		t.Errorf("a layout missing a layer stood for the export (%s)", got)
	}
	if got := intactLayoutDigest(filepath.Join(t.TempDir(), "none.tar")); got != "" {
		t.Errorf("no file stood for the export (%s)", got)
	}
}
