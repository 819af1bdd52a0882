package buildkit

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/containerd/log"
	"github.com/distribution/reference"
	dockerconfig "github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/config/types"
	"github.com/moby/buildkit/client"
	gateway "github.com/moby/buildkit/frontend/gateway/client"
	bksession "github.com/moby/buildkit/session"
	"github.com/moby/buildkit/session/auth/authprovider"

	"github.com/kiln-build/kiln/internal/config"
)

// RegistryEnv names the registry to push to when no flag does.
const RegistryEnv = "REGISTRY"

// RegistryHost validates a registry and says whether it may use plain HTTP.
func RegistryHost(registry string) (string, bool, error) {
	if registry == "" {
		registry = os.Getenv(RegistryEnv)
	}
	registry = strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(registry, "https://"), "http://"), "/")
	if registry == "" {
		return "", false, fmt.Errorf("no registry: pass -registry=HOST[:PORT] or set %s", RegistryEnv)
	}
	host, err := explicitHost(registry + "/x")
	if err != nil {
		return "", false, fmt.Errorf("registry %q: %w", registry, err)
	}
	// BuildKit, like containerd, reaches loopback registries over plain HTTP
	// and every other one over verified HTTPS; kiln's own client does the same.
	loopback, _ := docker.MatchLocalhost(host)
	return registry, loopback, nil
}

// dockerHubIndexHost is Docker Hub's legacy index host, which references
// may still name.
const dockerHubIndexHost = "index.docker.io"

// explicitHost is the registry host ref names, which it must name: a first
// element with no dot, port or "localhost" is a Docker Hub namespace to the
// reference grammar, so "buildhost/cache" would reach Docker Hub, with
// Docker Hub's credentials.
func explicitHost(ref string) (string, error) {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", err
	}
	host, _, _ := strings.Cut(ref, "/")
	// Docker Hub's legacy index host names Docker Hub: the grammar
	// normalizes it to docker.io.
	if domain := reference.Domain(named); domain != host && !(host == dockerHubIndexHost && domain == "docker.io") {
		return "", fmt.Errorf("%s is read as %s/%s: give the registry host with a dot or a port (e.g. %s:5000 or %s.example.com)", host, domain, host, host, host)
	}
	return host, nil
}

// DockerConfigDir is DOCKER_CONFIG, else ~/.docker, read at every call:
// the docker/cli package caches it for the life of the process.
func DockerConfigDir() string {
	if dir := os.Getenv("DOCKER_CONFIG"); dir != "" {
		return dir
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".docker")
}

// DockerConfigPath is where credentials are read from, for error messages.
func DockerConfigPath() string {
	return filepath.Join(DockerConfigDir(), dockerconfig.ConfigFileName)
}

// AuthSession gives BuildKit the Docker config's credentials, on demand:
// they never enter the LLB definition, the logs or an image. It answers only
// for the registries this build uses (hosts); any other registry the
// daemon asks about gets no credentials.
func AuthSession(ctx context.Context, hosts []string) []bksession.Attachable {
	cfg, err := dockerconfig.Load(DockerConfigDir())
	if err != nil {
		log.G(ctx).Warnf("read %s: %v; pushing without credentials", DockerConfigPath(), err)
	}
	return []bksession.Attachable{authprovider.NewDockerAuthProvider(authprovider.DockerAuthProviderConfig{
		AuthConfigProvider: scopedAuth(authprovider.LoadAuthConfig(cfg), hosts),
	})}
}

// scopedAuth answers for the given registry hosts only.
func scopedAuth(provider authprovider.AuthConfigProvider, hosts []string) authprovider.AuthConfigProvider {
	return func(ctx context.Context, host string, scope []string, check authprovider.ExpireCachedAuthCheck) (types.AuthConfig, error) {
		if !slices.Contains(hosts, host) && !(host == "registry-1.docker.io" && slices.Contains(hosts, "docker.io")) {
			return types.AuthConfig{}, nil
		}
		return provider(ctx, host, scope, check)
	}
}

// RegistryOf returns the registry host of a registry, repository or image
// reference (HOST[:PORT]/path[:tag][@digest]), by the reference grammar's
// rule: a first path element with a dot or a port, or localhost, is a host;
// otherwise the reference is Docker Hub's.
func RegistryOf(ref string) string {
	first, rest, hasPath := strings.Cut(ref, "/")
	if hasPath && rest != "" && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return first
	}
	return "docker.io"
}

// CacheImports are the layer caches the client asked for: a gateway build
// must pass them on to each solve itself, as the Dockerfile frontend does.
func CacheImports(c gateway.Client) []gateway.CacheOptionsEntry {
	var entries []gateway.CacheOptionsEntry
	if dt := c.BuildOpts().Opts["cache-imports"]; dt != "" {
		json.Unmarshal([]byte(dt), &entries) // written by the client library from our own options
	}
	return entries
}

// JobCacheImports imports the layer caches of every kind of job (exports
// are tagged per job kind: images, binaries, gocache).
func JobCacheImports(imports []client.CacheOptionsEntry) []client.CacheOptionsEntry {
	var out []client.CacheOptionsEntry
	for _, e := range imports {
		ref := e.Attrs["ref"]
		if e.Type != "registry" || ref == "" {
			out = append(out, e)
			continue
		}
		names := []string{"binaries", "images", "gocache"}
		for _, n := range names {
			attrs := map[string]string{}
			for k, v := range e.Attrs {
				attrs[k] = v
			}
			attrs["ref"] = JobCacheRef(ref, n)
			out = append(out, client.CacheOptionsEntry{Type: e.Type, Attrs: attrs})
		}
	}
	return out
}

// managedCacheTypes are the layer cache backends the managed buildkitd
// keeps; the patch drops gha, s3 and azblob.
var managedCacheTypes = []string{"registry", "local", "inline"}

// CacheEntries parses a layer cache from the flag, else the configuration.
func CacheEntries(flag, configured, name string) ([]client.CacheOptionsEntry, error) {
	value, source := cmp.Or(flag, configured), cacheSource(flag, name)
	if value == "" {
		return nil, nil
	}
	spec, err := config.ParseCache(value)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	if ref := spec.Attrs["ref"]; spec.Type == "registry" && ref != "" {
		if _, err := explicitHost(ref); err != nil {
			return nil, fmt.Errorf("%s: ref=%s: %w", source, ref, err)
		}
	}
	return []client.CacheOptionsEntry{{Type: spec.Type, Attrs: spec.Attrs}}, nil
}

// CheckCacheBackend refuses, before anything starts, a layer cache of a
// backend the managed buildkitd lacks, when it is the daemon the build runs
// on; flag and name are CacheEntries' own, to name where the cache was set.
func CheckCacheBackend(entries []client.CacheOptionsEntry, flag, name string) error {
	source := cacheSource(flag, name)
	for _, e := range entries {
		if !slices.Contains(managedCacheTypes, e.Type) && os.Getenv(HostEnv) == "" {
			return fmt.Errorf("%s: a %s cache needs a BuildKit daemon that has that backend, and kiln's managed buildkitd has only %s (managed/tools/buildkitd.patch): set %s to such a daemon", source, e.Type, strings.Join(managedCacheTypes, ", "), HostEnv)
		}
	}
	return nil
}

// cacheSource names where a layer cache was set: the flag, else the
// configuration file.
func cacheSource(flag, name string) string {
	if flag == "" {
		return config.File + " cache"
	}
	return name
}

// Resolver is a registry client for kiln's own reads and writes (base
// digests, snapshots, signatures, attestations): plain HTTP when plainHTTP
// (a loopback registry, as BuildKit reaches it), else HTTPS, whose
// certificate is checked unless skipVerify (-skiptlsverify: a registry
// whose certificate no CA of this machine signed). Credentials come from
// creds; skipping the check never sends them in clear text.
func Resolver(plainHTTP, skipVerify bool, creds func(host string) (string, string, error)) remotes.Resolver {
	var client *http.Client
	if skipVerify {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // asked for with -skiptlsverify
		client = &http.Client{Transport: tr}
	}
	authOpts := []docker.AuthorizerOpt{docker.WithAuthCreds(creds)}
	opts := []docker.RegistryOpt{docker.WithPlainHTTP(func(string) (bool, error) { return plainHTTP, nil })}
	if client != nil {
		authOpts = append(authOpts, docker.WithAuthClient(client))
		opts = append(opts, docker.WithClient(client))
	}
	opts = append(opts, docker.WithAuthorizer(docker.NewDockerAuthorizer(authOpts...)))
	return docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(opts...)})
}

// Credentials answers a registry's credential requests from the Docker
// config.
func Credentials() func(host string) (string, string, error) {
	cfg, _ := dockerconfig.Load(DockerConfigDir())
	return func(host string) (string, string, error) {
		if cfg == nil {
			return "", "", nil
		}
		// Docker keeps Docker Hub's credentials under its legacy index
		// URL, not the host the registry API answers on; BuildKit's auth
		// provider maps the two, and so does kiln's own client.
		if host == authprovider.DockerHubRegistryHost {
			host = authprovider.DockerHubConfigfileKey
		}
		a, err := cfg.GetAuthConfig(host)
		if err != nil {
			return "", "", err
		}
		if a.IdentityToken != "" {
			return "", a.IdentityToken, nil
		}
		return a.Username, a.Password, nil
	}
}

// WriteBlob pushes data as d, a blob or a manifest, and succeeds when the
// registry holds it already.
func WriteBlob(ctx context.Context, pusher remotes.Pusher, d ocispec.Descriptor, data []byte) error {
	w, err := pusher.Push(ctx, d)
	if errdefs.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer w.Close()
	if _, err := w.Write(data); err != nil {
		return err
	}
	if err := w.Commit(ctx, d.Size, d.Digest); err != nil && !errdefs.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// ReadBlob fetches a descriptor's content, at most max bytes, and checks it
// against the descriptor's size and digest: a registry is trusted to be
// neither small nor honest.
func ReadBlob(ctx context.Context, f remotes.Fetcher, desc ocispec.Descriptor, max int64) ([]byte, error) {
	if desc.Size > max {
		return nil, fmt.Errorf("%s is %d bytes; more than kiln reads here (%d)", desc.Digest, desc.Size, max)
	}
	rc, err := f.Fetch(ctx, desc)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != desc.Size || digest.FromBytes(data) != desc.Digest {
		return nil, fmt.Errorf("content of %s does not match its descriptor", desc.Digest)
	}
	return data, nil
}
