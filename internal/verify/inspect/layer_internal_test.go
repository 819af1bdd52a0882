package inspect

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
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
