package buildkit

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"

	dockerconfig "github.com/docker/cli/cli/config"
	"github.com/moby/buildkit/session/auth/authprovider"
)

// The daemon asks the client for credentials by host: a registry the build
// does not use gets none, however the daemon was told to ask.
func TestRegistryCredentialsGoOnlyToTheBuildsRegistries(t *testing.T) {
	dir := t.TempDir()
	auth := func(user, pass string) string { return base64.StdEncoding.EncodeToString([]byte(user + ":" + pass)) }
	config := `{"auths":{"push.example:5000":{"auth":"` + auth("kiln", "push-pass") + `"},"unrelated.example":{"auth":"` + auth("canary", "canary-pass") + `"}}}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := dockerconfig.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	provider := scopedAuth(authprovider.LoadAuthConfig(cfg), []string{"push.example:5000"})
	got, err := provider(context.Background(), "push.example:5000", nil, nil)
	if err != nil || got.Password != "push-pass" {
		t.Errorf("the push registry got %+v, %v", got, err)
	}
	got, err = provider(context.Background(), "unrelated.example", nil, nil)
	if err != nil || got.Password != "" || got.Username != "" {
		t.Errorf("an unrelated registry was offered %+v (%v)", got, err)
	}
}
