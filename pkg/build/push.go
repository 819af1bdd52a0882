package build

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/distribution/reference"
	"github.com/docker/cli/cli/config"
	"github.com/moby/buildkit/client"
	bksession "github.com/moby/buildkit/session"
	"github.com/moby/buildkit/session/auth/authprovider"

	"github.com/sirupsen/logrus"

	"github.com/kiln-build/kiln/pkg/buildkit"
)

// RegistryEnv names the registry to push to when no flag does.
const RegistryEnv = "REGISTRY"

// PushOptions say where images go.
type PushOptions struct {
	// Registry is host[:port][/path]; REGISTRY when empty.
	Registry string
	// Latest also tags each image latest.
	Latest bool
	// Insecure allows plain HTTP to a registry that is not on loopback.
	Insecure bool
}

// PushResult is one pushed image.
type PushResult struct {
	Name   string   `json:"name"`
	Refs   []string `json:"refs"`
	Digest string   `json:"digest"`
}

// registryHost validates a registry and says whether it may use plain HTTP.
func registryHost(registry string, insecure bool) (string, bool, error) {
	if registry == "" {
		registry = os.Getenv(RegistryEnv)
	}
	registry = strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(registry, "https://"), "http://"), "/")
	if registry == "" {
		return "", false, fmt.Errorf("no registry: pass -registry=HOST[:PORT] or set %s", RegistryEnv)
	}
	if _, err := reference.ParseNormalizedNamed(registry + "/x"); err != nil {
		return "", false, fmt.Errorf("registry %q: %w", registry, err)
	}
	host := strings.SplitN(registry, "/", 2)[0]
	hostname := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		hostname = h
	}
	loopback := hostname == "localhost"
	if ip := net.ParseIP(hostname); ip != nil && ip.IsLoopback() {
		loopback = true
	}
	return registry, loopback || insecure, nil
}

// dockerConfigDir is DOCKER_CONFIG, else ~/.docker, read at every call:
// the docker/cli package caches it for the life of the process.
func dockerConfigDir() string {
	if dir := os.Getenv("DOCKER_CONFIG"); dir != "" {
		return dir
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".docker")
}

// dockerConfigPath is where credentials are read from, for error messages.
func dockerConfigPath() string {
	return filepath.Join(dockerConfigDir(), config.ConfigFileName)
}

// authSession gives BuildKit the Docker config's credentials, on demand:
// they never enter the LLB definition, the logs or an image.
func authSession() []bksession.Attachable {
	cfg, err := config.Load(dockerConfigDir())
	if err != nil {
		logrus.Warnf("read %s: %v; pushing without credentials", dockerConfigPath(), err)
	}
	return []bksession.Attachable{authprovider.NewDockerAuthProvider(authprovider.DockerAuthProviderConfig{
		AuthConfigProvider: authprovider.LoadAuthConfig(cfg),
	})}
}

// Push builds every image and pushes it, all platforms in one index, tagged
// with the version (and latest when asked).
func Push(ctx context.Context, opts Options, popts PushOptions) ([]PushResult, error) {
	registry, plainHTTP, err := registryHost(popts.Registry, popts.Insecure)
	if err != nil {
		return nil, err
	}
	s, err := start(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer s.close()
	return s.push(ctx, registry, plainHTTP, popts.Latest)
}

func (s *session) push(ctx context.Context, registry string, plainHTTP, latest bool) ([]PushResult, error) {
	return s.pushWith(ctx, registry, plainHTTP, latest, nil)
}

// pushWith pushes with extra frontend attributes, e.g. attestation requests.
func (s *session) pushWith(ctx context.Context, registry string, plainHTTP, latest bool, attrs map[string]string) ([]PushResult, error) {
	tags := []string{s.plan.Stamp.Version}
	if latest {
		tags = append(tags, "latest")
	}
	var jobs []buildkit.Job
	var results []PushResult
	for _, img := range s.plan.Images {
		var refs []string
		for _, tag := range tags {
			ref := fmt.Sprintf("%s/%s/%s:%s", registry, s.plan.Repository, img.Name, tag)
			if _, err := reference.ParseNormalizedNamed(ref); err != nil {
				return nil, fmt.Errorf("image reference %q: %w", ref, err)
			}
			refs = append(refs, ref)
		}
		exportAttrs := s.exporterAttrs(strings.Join(refs, ","))
		exportAttrs["push"] = "true"
		if plainHTTP {
			exportAttrs["registry.insecure"] = "true"
		}
		frontendAttrs := map[string]string{"platform": strings.Join(s.plan.PlatformIDs(), ",")}
		for k, v := range attrs {
			frontendAttrs[k] = v
		}
		jobs = append(jobs, buildkit.Job{
			Name:          img.Name,
			Build:         s.imageBuild(img),
			FrontendAttrs: frontendAttrs,
			Export:        client.ExportEntry{Type: client.ExporterImage, Attrs: exportAttrs},
		})
		results = append(results, PushResult{Name: img.Name, Refs: refs})
	}
	out, err := s.solveImages(ctx, jobs)
	if err != nil {
		return nil, explainPush(err, registry)
	}
	for i := range results {
		results[i].Digest = out.Results[i].Digest
	}
	return results, nil
}

// status401 is an HTTP 401, not a port or digest that contains 401.
var status401 = regexp.MustCompile(`(^|[^0-9:.a-f])401([^0-9a-f]|$)`)

// explainPush adds the remedy to the registry errors people meet most.
func explainPush(err error, registry string) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "connection refused") || strings.Contains(msg, "no such host") || strings.Contains(msg, "i/o timeout"):
		return fmt.Errorf("push to %s: the registry is unreachable; start it or fix -registry/%s, then run the push again: %w", registry, RegistryEnv, err)
	case status401.MatchString(msg) || strings.Contains(strings.ToLower(msg), "unauthorized") || strings.Contains(msg, "authentication required"):
		return fmt.Errorf("push to %s: the registry refused the credentials (401); kiln reads them from %s (DOCKER_CONFIG); log in with `docker login %s` or fix that file: %w", registry, dockerConfigPath(), registry, err)
	}
	return fmt.Errorf("push to %s: %w", registry, err)
}
