package testdaemon

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
)

// PushLayer pushes a one-layer image (an uncompressed tar) under each tag,
// as an attacker with write access to the repository could.
func (r *Registry) PushLayer(t testing.TB, name string, tags []string, layer []byte) {
	t.Helper()
	layerDigest := r.pushBlob(t, name, layer)
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	configDigest := r.pushBlob(t, name, config)
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": configDigest, "size": len(config)},
		"layers":        []map[string]any{{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": len(layer)}},
	})
	for _, tag := range tags {
		req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf(r.scheme+"://%s/v2/%s/manifests/%s", r.Addr, name, tag), bytes.NewReader(manifest))
		req.Header.Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		r.do(t, req, http.StatusCreated)
	}
}

func (r *Registry) pushBlob(t testing.TB, name string, data []byte) string {
	t.Helper()
	dg := fmt.Sprintf("sha256:%x", sha256.Sum256(data))
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf(r.scheme+"://%s/v2/%s/blobs/uploads/", r.Addr, name), nil)
	resp := r.do(t, req, http.StatusAccepted)
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		t.Fatal(err)
	}
	if !loc.IsAbs() {
		loc, _ = url.Parse(fmt.Sprintf(r.scheme+"://%s%s", r.Addr, loc))
	}
	q := loc.Query()
	q.Set("digest", dg)
	loc.RawQuery = q.Encode()
	req, _ = http.NewRequest(http.MethodPut, loc.String(), bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/octet-stream")
	r.do(t, req, http.StatusCreated)
	return dg
}

func (r *Registry) do(t testing.TB, req *http.Request, want int) *http.Response {
	t.Helper()
	req.SetBasicAuth(r.User, r.Pass)
	resp, err := r.client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %s", req.Method, req.URL.Path, resp.Status)
	}
	return resp
}

// PutManifest stores a manifest or index under a tag, as an attacker with
// write access to the repository could.
func (r *Registry) PutManifest(t testing.TB, name, tag, mediaType string, body []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf(r.scheme+"://%s/v2/%s/manifests/%s", r.Addr, name, tag), bytes.NewReader(body))
	req.Header.Set("Content-Type", mediaType)
	r.do(t, req, http.StatusCreated)
}
