package gocache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/log"
	"github.com/moby/buildkit/client/llb"
	"github.com/opencontainers/go-digest"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/sign"
)

// SigningKeyEnv names the cosign key (a cosign.key file, or env://VAR)
// that signs published Go cache snapshots; SigningPasswordEnv its
// password, else COSIGN_PASSWORD.
const (
	SigningKeyEnv      = "KILN_GOCACHE_SIGNING_KEY"
	SigningPasswordEnv = "KILN_GOCACHE_SIGNING_PASSWORD"
)

// Result is a published Go cache snapshot.
type Result struct {
	Refs   []string `json:"refs"`
	Digest string   `json:"digest"`
	// Signed is true when a cosign signature of it was pushed
	// (sha256-<hex>.sig).
	Signed bool `json:"signed"`
}

// Repo checks a snapshot repository (HOST[:PORT]/path) and says
// whether it is reached over plain HTTP.
func Repo(repo, flag string) (string, bool, error) {
	repo = strings.TrimSuffix(repo, "/")
	if !strings.Contains(repo, "/") {
		return "", false, fmt.Errorf("%s=%s: give a repository, HOST[:PORT]/path (e.g. %s/antrea/gocache)", flag, repo, repo)
	}
	r, plainHTTP, err := buildkit.RegistryHost(repo)
	if err != nil {
		return "", false, fmt.Errorf("%s: %w", flag, err)
	}
	return r, plainHTTP, nil
}

// SeededCacheID is the Go cache mount a build seeded from a snapshot uses.
func SeededCacheID(shared, snapshotDigest string) string {
	_, hex, _ := strings.Cut(snapshotDigest, ":")
	if len(hex) > 12 {
		hex = hex[:12]
	}
	return shared + "-seed-" + hex
}

// Keys reads the pinned snapshot key (pinnedPath: session.Options.GoCacheKey,
// else cache.gocacheKey) and, when publishing, the signing key of SigningKeyEnv,
// which must match the pinned one.
func Keys(pinnedPath string, publishing bool) (*sign.Verifier, *sign.Signer, error) {
	var pinned *sign.Verifier
	if path := pinnedPath; path != "" {
		var err error
		if pinned, err = sign.LoadPublicKey(path); err != nil {
			return nil, nil, fmt.Errorf("cache.gocacheKey: %w", err)
		}
	}
	path := os.Getenv(SigningKeyEnv)
	if !publishing || path == "" {
		if publishing && pinned != nil {
			return nil, nil, fmt.Errorf("%s: cache.gocacheKey pins a key, so published snapshots must be signed: set %s to the matching cosign.key (or env://VAR) and its password in %s or COSIGN_PASSWORD", config.File, SigningKeyEnv, SigningPasswordEnv)
		}
		return pinned, nil, nil
	}
	password, ok := os.LookupEnv(SigningPasswordEnv)
	if !ok {
		password = os.Getenv("COSIGN_PASSWORD")
	}
	signing, err := sign.LoadKey(path, []byte(password))
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", SigningKeyEnv, err)
	}
	if pinned != nil && !pinned.Matches(signing) {
		return nil, nil, fmt.Errorf("%s=%s does not match the public key cache.gocacheKey pins", SigningKeyEnv, path)
	}
	return pinned, signing, nil
}

// Seed fetches the best snapshot in repo for the plan's toolchain and Go
// environment, nil when there is none or it is refused: any failure is a
// warning, and the build goes on without it (slower, never wrong). targets
// are the platforms of the snapshot to look for (Tags), the plan's when
// nil: a part of a spread build seeds from the whole build's snapshot.
func Seed(ctx context.Context, repo string, p *plan.Plan, targets []string, cacheDir string, max int64, key *sign.Verifier) *Snapshot {
	repo, plainHTTP, err := Repo(repo, "-gocachefrom")
	if err != nil {
		log.G(ctx).Warnf("Go cache snapshot: %v; building without it", err)
		return nil
	}
	snap, err := Fetch(ctx, repo, Tags(p, targets), cacheDir, FetchOptions{PlainHTTP: plainHTTP, Credentials: buildkit.Credentials(), Max: max, Verifier: key})
	switch {
	case errors.Is(err, ErrNotFound):
		log.G(ctx).Infof("Go cache snapshot: none in %s for this toolchain and Go environment yet", repo)
		return nil
	case err != nil:
		log.G(ctx).Warnf("Go cache snapshot rejected: %v; building without it (slower, never wrong)", err)
		return nil
	}
	log.G(ctx).Infof("Go cache snapshot %s (%s): %d entries, %d MiB", snap.Ref, snap.Digest, snap.Entries, snap.Bytes>>20)
	return snap
}

// Push solves st and pushes it as a single-platform image under refs,
// exporting the layer cache too when exportCache; it returns the digest.
type Push func(ctx context.Context, name string, st llb.State, refs []string, exportCache bool) (string, error)

// Publish pushes snapshot, the Go cache entries of the plan's packages, as
// a one-layer image tagged with Tags in repo, and, with a signing key, its
// cosign signature (sha256-<hex>.sig), which `cosign verify --key` checks.
func Publish(ctx context.Context, repo string, p *plan.Plan, snapshot llb.State, signing *sign.Signer, push Push) (*Result, error) {
	repo, plainHTTP, err := Repo(repo, "-gocacheto")
	if err != nil {
		return nil, err
	}
	var refs []string
	for _, tag := range Tags(p, nil) {
		refs = append(refs, repo+":"+tag)
	}
	dgst, err := push(ctx, "gocache", snapshot, refs, true)
	if err != nil {
		return nil, fmt.Errorf("publish the Go cache snapshot to %s: %w", repo, err)
	}
	res := &Result{Refs: refs, Digest: dgst}
	if signing == nil {
		return res, nil
	}
	sig, err := signing.SignatureLayer(repo, digest.Digest(dgst))
	if err != nil {
		return nil, err
	}
	resolver := newResolver(FetchOptions{PlainHTTP: plainHTTP, Credentials: buildkit.Credentials()})
	if _, err := sign.Attach(ctx, resolver, repo, digest.Digest(dgst), "sig", []sign.Layer{sig}); err != nil {
		return nil, fmt.Errorf("sign the Go cache snapshot %s: %w", refs[0], err)
	}
	res.Signed = true
	return res, nil
}
