package inspect

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// TestLayersOfEveryCompressionAreRead: verify reads a base image's layers
// whether gzip, zstd or uncompressed.
func TestLayersOfEveryCompressionAreRead(t *testing.T) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	tw.WriteHeader(&tar.Header{Name: "etc/os-release", Mode: 0o644, Size: 6, Typeflag: tar.TypeReg})
	tw.Write([]byte("ID=x\n\n"))
	tw.Close()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw.Bytes())
	zw.Close()
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	zst := enc.EncodeAll(raw.Bytes(), nil)
	for name, data := range map[string][]byte{"uncompressed": raw.Bytes(), "gzip": gz.Bytes(), "zstd": zst} {
		files, err := readLayer(data)
		if err != nil || len(files) != 1 || files[0].Path != "etc/os-release" || string(files[0].Data) != "ID=x\n\n" {
			t.Errorf("%s layer: %+v, %v", name, files, err)
		}
	}
}

// TestIndexManifestsListThePlatformsInIndexOrder: from the layout's
// index.json to its image index, whose entries name their platforms.
func TestIndexManifestsListThePlatformsInIndexOrder(t *testing.T) {
	index := []byte(`{"schemaVersion":2,"manifests":[` +
		`{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:` + strings.Repeat("a", 64) + `","size":1,"platform":{"os":"linux","architecture":"arm","variant":"v7"}},` +
		`{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:` + strings.Repeat("b", 64) + `","size":1,"platform":{"os":"linux","architecture":"amd64"}}]}`)
	sum := fmt.Sprintf("%x", sha256.Sum256(index))
	top := []byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:` + sum + `","size":` + fmt.Sprint(len(index)) + `}]}`)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, data := range map[string][]byte{"index.json": top, "blobs/sha256/" + sum: index} {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg})
		tw.Write(data)
	}
	tw.Close()
	path := filepath.Join(t.TempDir(), "img.oci.tar")
	os.WriteFile(path, buf.Bytes(), 0o644)
	got, err := IndexManifests(path)
	want := []PlatformDigest{{"linux/arm/v7", "sha256:" + strings.Repeat("a", 64)}, {"linux/amd64", "sha256:" + strings.Repeat("b", 64)}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("IndexManifests: %v, %v; want %v", got, err, want)
	}
	os.WriteFile(path, []byte("not a tarball"), 0o644)
	if _, err := IndexManifests(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("a file that is no layout: %v", err)
	}
}
