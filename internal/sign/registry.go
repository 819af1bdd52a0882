package sign

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/buildkit"
)

// maxObject bounds what is read of a signature or attestation object: a
// registry is not trusted to be small.
const maxObject = 64 << 20

// maxLayers bounds the signatures or attestations of one digest.
const maxLayers = 64

// Layer is one signature or attestation in a .sig or .att manifest.
type Layer struct {
	MediaType   string
	Data        []byte
	Annotations map[string]string
}

// Tag is cosign's tag for a digest's signatures ("sig") or attestations
// ("att").
func Tag(dgst digest.Digest, kind string) string {
	return fmt.Sprintf("%s-%s.%s", dgst.Algorithm(), dgst.Encoded(), kind)
}

// SignatureLayer signs the payload of an image digest.
func (s *Signer) SignatureLayer(repository string, dgst digest.Digest) (Layer, error) {
	p := Payload(repository, dgst)
	sig, err := s.Sign(p)
	if err != nil {
		return Layer{}, err
	}
	return Layer{MediaType: SimpleSigningMediaType, Data: p, Annotations: map[string]string{SignatureAnnotation: sig}}, nil
}

// AttestationLayer signs an in-toto statement of predicateType.
func (s *Signer) AttestationLayer(statement []byte, predicateType string) (Layer, error) {
	env, err := s.Envelope(statement)
	if err != nil {
		return Layer{}, err
	}
	return Layer{MediaType: DSSEMediaType, Data: env, Annotations: map[string]string{SignatureAnnotation: "", "predicateType": predicateType}}, nil
}

// Attach writes layers as the repository's sha256-<hex>.<kind> manifest,
// replacing what was there: a release re-signs everything it publishes.
// repository is HOST/NAME. It returns the manifest's digest.
func Attach(ctx context.Context, resolver remotes.Resolver, repository string, subject digest.Digest, kind string, layers []Layer) (digest.Digest, error) {
	ref := repository + ":" + Tag(subject, kind)
	pusher, err := resolver.Pusher(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("attach %s: %w", ref, err)
	}
	var diffIDs []digest.Digest
	var descs []ocispec.Descriptor
	for _, l := range layers {
		d := ocispec.Descriptor{MediaType: l.MediaType, Digest: digest.FromBytes(l.Data), Size: int64(len(l.Data)), Annotations: l.Annotations}
		if err := buildkit.WriteBlob(ctx, pusher, d, l.Data); err != nil {
			return "", fmt.Errorf("attach %s: %w", ref, err)
		}
		descs = append(descs, d)
		diffIDs = append(diffIDs, d.Digest)
	}
	config, _ := json.Marshal(ocispec.Image{RootFS: ocispec.RootFS{Type: "layers", DiffIDs: diffIDs}})
	configDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(config), Size: int64(len(config))}
	if err := buildkit.WriteBlob(ctx, pusher, configDesc, config); err != nil {
		return "", fmt.Errorf("attach %s: %w", ref, err)
	}
	manifest, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: configDesc, Layers: descs})
	md := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(manifest), Size: int64(len(manifest))}
	if err := buildkit.WriteBlob(ctx, pusher, md, manifest); err != nil {
		return "", fmt.Errorf("attach %s: %w", ref, err)
	}
	return md.Digest, nil
}

// fetchTagged reads what a tag names, bounded and checked against its
// digest; errdefs.ErrNotFound when the tag is absent.
func fetchTagged(ctx context.Context, resolver remotes.Resolver, ref string) (remotes.Fetcher, []byte, error) {
	_, desc, err := resolver.Resolve(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	fetcher, err := resolver.Fetcher(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	data, err := buildkit.ReadBlob(ctx, fetcher, desc, maxObject)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", ref, err)
	}
	return fetcher, data, nil
}

// Fetch returns the layers of the repository's sha256-<hex>.<kind>
// manifest, each checked against its digest; errdefs.ErrNotFound when
// there is none.
func Fetch(ctx context.Context, resolver remotes.Resolver, repository string, subject digest.Digest, kind string) ([]Layer, error) {
	ref := repository + ":" + Tag(subject, kind)
	fetcher, data, err := fetchTagged(ctx, resolver, ref)
	if err != nil {
		return nil, err
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: not an image manifest: %w", ref, err)
	}
	if len(m.Layers) > maxLayers {
		return nil, fmt.Errorf("%s holds %d layers; kiln reads at most %d", ref, len(m.Layers), maxLayers)
	}
	var out []Layer
	for _, l := range m.Layers {
		data, err := buildkit.ReadBlob(ctx, fetcher, l, maxObject)
		if err != nil {
			return nil, fmt.Errorf("%s: layer %s: %w", ref, l.Digest, err)
		}
		out = append(out, Layer{MediaType: l.MediaType, Data: data, Annotations: l.Annotations})
	}
	return out, nil
}

// VerifyImage checks that a signature of subject in repository verifies
// with the key and names that digest.
//
// It reads Sigstore bundles referring to subject first, as cosign v3
// does, and the sha256-<hex>.sig tag when none of them is a signature that
// verifies (a bundle anyone may add cannot hide a valid signature).
func (v *Verifier) VerifyImage(ctx context.Context, resolver remotes.Resolver, repository string, subject digest.Digest) error {
	bundles, err := FetchBundles(ctx, resolver, repository, subject)
	if err != nil {
		return err
	}
	for _, b := range bundles {
		raw, err := v.OpenBundle(b.Data)
		if err != nil {
			continue
		}
		if st, err := parseStatement(raw); err == nil && st.PredicateType == SignPredicateType && st.names(subject) {
			return nil
		}
	}
	layers, err := Fetch(ctx, resolver, repository, subject, "sig")
	if errdefs.IsNotFound(err) && len(bundles) > 0 {
		return fmt.Errorf("%s@%s: no signature among the %d bundles referring to it verifies with %s and names this digest, and it has no %s tag", repository, subject, len(bundles), v.path, Tag(subject, "sig"))
	}
	if errdefs.IsNotFound(err) {
		return fmt.Errorf("%s@%s has no signature (%s)", repository, subject, Tag(subject, "sig"))
	}
	if err != nil {
		return err
	}
	for _, l := range layers {
		if l.MediaType != SimpleSigningMediaType || v.Verify(l.Data, l.Annotations[SignatureAnnotation]) != nil {
			continue
		}
		var p payload
		if json.Unmarshal(l.Data, &p) == nil && p.Critical.Image.Digest == subject.String() {
			return nil
		}
	}
	return fmt.Errorf("%s@%s: no signature in %s verifies with %s and names this digest", repository, subject, Tag(subject, "sig"), v.path)
}

// Statement is a verified in-toto statement.
type Statement struct {
	Type          string `json:"_type"`
	PredicateType string `json:"predicateType"`
	Subject       []struct {
		Name   string            `json:"name"`
		Digest map[string]string `json:"digest"`
	} `json:"subject"`
	Predicate json.RawMessage `json:"predicate"`
}

// VerifyAttestations returns the attestations of subject whose envelopes
// verify with the key and whose statements name subject; it fails when an
// attestation does not verify, naming it.
//
// Bundles referring to subject come first, as for VerifyImage: when any
// of them verifies, every bundle must, and the tags are not read. A
// statement attached twice counts once: on a registry with the referrers
// API a release run again leaves the earlier bundles listed, and a
// release's statements are reproducible.
func (v *Verifier) VerifyAttestations(ctx context.Context, resolver remotes.Resolver, repository string, subject digest.Digest) ([]Statement, error) {
	bundles, err := FetchBundles(ctx, resolver, repository, subject)
	if err != nil {
		return nil, err
	}
	if out, err := v.bundleStatements(bundles, repository, subject); out != nil || err != nil {
		return out, err
	}
	layers, err := Fetch(ctx, resolver, repository, subject, "att")
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("%s@%s has no attestations (%s)", repository, subject, Tag(subject, "att"))
	}
	if err != nil {
		return nil, err
	}
	var out []Statement
	for i, l := range layers {
		what := fmt.Sprintf("%s@%s attestation %d (%s)", repository, subject, i, l.Annotations["predicateType"])
		raw, err := v.OpenEnvelope(l.Data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		st, err := parseStatement(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if !st.names(subject) {
			return nil, fmt.Errorf("%s: its statement's subjects do not include %s", what, subject)
		}
		out = append(out, st)
	}
	return out, nil
}

// bundleStatements are the attestations among bundles; nil when no
// bundle verifies with the key.
func (v *Verifier) bundleStatements(bundles []Layer, repository string, subject digest.Digest) ([]Statement, error) {
	var out []Statement
	seen := map[digest.Digest]bool{}
	verified := false
	var failed error
	for i, b := range bundles {
		what := fmt.Sprintf("%s@%s bundle %d (%s)", repository, subject, i, b.Annotations[bundlePredicateAnnotation])
		raw, err := v.OpenBundle(b.Data)
		if err != nil {
			failed = fmt.Errorf("%s: %w", what, err)
			continue
		}
		verified = true
		st, err := parseStatement(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if st.PredicateType == SignPredicateType || seen[digest.FromBytes(raw)] {
			continue
		}
		seen[digest.FromBytes(raw)] = true
		if !st.names(subject) {
			return nil, fmt.Errorf("%s: its statement's subjects do not include %s", what, subject)
		}
		out = append(out, st)
	}
	switch {
	case !verified:
		return nil, nil
	case failed != nil:
		return nil, failed
	case len(out) == 0:
		return nil, fmt.Errorf("%s@%s has no attestations among the %d bundles referring to it", repository, subject, len(bundles))
	}
	return out, nil
}

func parseStatement(raw []byte) (Statement, error) {
	var st Statement
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("not an in-toto statement: %w", err)
	}
	return st, nil
}

// names tells whether the statement's subjects include the digest.
func (st Statement) names(subject digest.Digest) bool {
	for _, s := range st.Subject {
		if s.Digest[subject.Algorithm().String()] == subject.Encoded() {
			return true
		}
	}
	return false
}

// Repository is HOST/NAME of a reference HOST/NAME[:TAG][@DIGEST].
func Repository(ref string) string {
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref = ref[:i]
	}
	return ref
}
