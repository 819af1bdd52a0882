package sign

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/errdefs"
	intoto "github.com/in-toto/attestation/go/v1"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	protobundle "github.com/sigstore/protobuf-specs/gen/pb-go/bundle/v1"
	protocommon "github.com/sigstore/protobuf-specs/gen/pb-go/common/v1"
	protodsse "github.com/sigstore/protobuf-specs/gen/pb-go/dsse"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kiln-build/kiln/internal/buildkit"
)

// cosign v3's layout: each signature or attestation is a Sigstore bundle
// (a DSSE envelope of an in-toto statement, the key's hint, no
// transparency log entry) in a manifest of its own whose subject is the
// signed image, found through the registry's referrers API or, where the
// registry has none, the referrers tag schema (an index tagged
// sha256-<hex>).
const (
	BundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json"
	// SignPredicateType is the statement cosign v3 signs for an image.
	SignPredicateType = "https://sigstore.dev/cosign/sign/v1"

	bundleContentAnnotation   = "dev.sigstore.bundle.content"
	bundlePredicateAnnotation = "dev.sigstore.bundle.predicateType"
	emptyJSON                 = "{}"
)

// SignatureStatement is what an image signature signs in cosign v3's
// layout: an in-toto statement naming the digest.
func SignatureStatement(subject digest.Digest) ([]byte, error) {
	return StatementJSON(&intoto.Statement{
		Type:          intoto.StatementTypeUri,
		Subject:       []*intoto.ResourceDescriptor{{Digest: map[string]string{subject.Algorithm().String(): subject.Encoded()}}},
		PredicateType: SignPredicateType,
		Predicate:     &structpb.Struct{},
	})
}

// StatementJSON is an in-toto statement as kiln signs it: checked by the
// library (a type, a predicate type, a subject with a digest) and written
// with stable bytes, so a release rebuilt attests the same.
func StatementJSON(st *intoto.Statement) ([]byte, error) {
	if err := st.Validate(); err != nil {
		return nil, fmt.Errorf("in-toto statement: %w", err)
	}
	return compactProto(st)
}

// compactProto marshals a message as JSON with stable bytes: protojson
// varies its whitespace on purpose.
func compactProto(m proto.Message) ([]byte, error) {
	data, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := json.Compact(&b, data); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Bundle signs an in-toto statement into a Sigstore bundle.
func (s *Signer) Bundle(statement []byte) ([]byte, error) {
	sig, err := s.sv.SignMessage(bytes.NewReader(dsse.PAE(InTotoPayloadType, statement)))
	if err != nil {
		return nil, err
	}
	pub, err := s.sv.PublicKey()
	if err != nil {
		return nil, err
	}
	der, err := cryptoutils.MarshalPublicKeyToDER(pub)
	if err != nil {
		return nil, err
	}
	hint := sha256.Sum256(der)
	b := &protobundle.Bundle{
		MediaType: BundleMediaType,
		VerificationMaterial: &protobundle.VerificationMaterial{
			Content: &protobundle.VerificationMaterial_PublicKey{PublicKey: &protocommon.PublicKeyIdentifier{Hint: base64.StdEncoding.EncodeToString(hint[:])}},
		},
		Content: &protobundle.Bundle_DsseEnvelope{DsseEnvelope: &protodsse.Envelope{
			Payload: statement, PayloadType: InTotoPayloadType, Signatures: []*protodsse.Signature{{Sig: sig}},
		}},
	}
	return compactProto(b)
}

// OpenBundle verifies a bundle's envelope with the key and returns its
// statement.
func (v *Verifier) OpenBundle(data []byte) ([]byte, error) {
	var b protobundle.Bundle
	// Fields of a newer bundle version kiln does not know are not needed
	// to check the envelope.
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("not a Sigstore bundle: %w", err)
	}
	env := b.GetDsseEnvelope()
	if env == nil {
		return nil, fmt.Errorf("the bundle holds no DSSE envelope")
	}
	if env.PayloadType != InTotoPayloadType {
		return nil, fmt.Errorf("payload type %q, want %s", env.PayloadType, InTotoPayloadType)
	}
	if len(env.Signatures) > 16 {
		return nil, fmt.Errorf("the envelope holds %d signatures; kiln checks at most 16", len(env.Signatures))
	}
	pae := dsse.PAE(InTotoPayloadType, env.Payload)
	for _, s := range env.Signatures {
		if v.Verify(pae, base64.StdEncoding.EncodeToString(s.Sig)) == nil {
			return env.Payload, nil
		}
	}
	return nil, fmt.Errorf("no signature of the bundle verifies with %s", v.path)
}

// Referrer is one bundle to attach, with the predicate type it carries.
type Referrer struct {
	Bundle        []byte
	PredicateType string
}

// AttachReferrers pushes each bundle as a manifest whose subject is the
// signed image, and writes the referrers tag schema index (sha256-<hex>)
// for registries without the referrers API, replacing the bundles an
// earlier release listed there and keeping every other referrer: a
// release re-signs everything it publishes. repository is HOST/NAME. It
// returns the bundles' manifests' digests, in the order given.
func AttachReferrers(ctx context.Context, resolver remotes.Resolver, repository string, subject ocispec.Descriptor, referrers []Referrer) ([]digest.Digest, error) {
	var listed []ocispec.Descriptor
	var attached []digest.Digest
	for _, r := range referrers {
		layer := ocispec.Descriptor{MediaType: BundleMediaType, Digest: digest.FromBytes(r.Bundle), Size: int64(len(r.Bundle))}
		cfg := ocispec.Descriptor{MediaType: ocispec.MediaTypeEmptyJSON, Digest: digest.FromString(emptyJSON), Size: int64(len(emptyJSON))}
		annotations := map[string]string{bundleContentAnnotation: "dsse-envelope", bundlePredicateAnnotation: r.PredicateType}
		subj := ocispec.Descriptor{MediaType: subject.MediaType, Digest: subject.Digest, Size: subject.Size}
		manifest, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
			ArtifactType: BundleMediaType, Config: cfg, Layers: []ocispec.Descriptor{layer}, Subject: &subj, Annotations: annotations})
		md := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: BundleMediaType, Digest: digest.FromBytes(manifest), Size: int64(len(manifest)), Annotations: annotations}
		ref := repository + "@" + md.Digest.String()
		pusher, err := resolver.Pusher(ctx, ref)
		if err != nil {
			return nil, fmt.Errorf("attach %s: %w", ref, err)
		}
		for _, blob := range []struct {
			d    ocispec.Descriptor
			data []byte
		}{{layer, r.Bundle}, {cfg, []byte(emptyJSON)}, {md, manifest}} {
			if err := buildkit.WriteBlob(ctx, pusher, blob.d, blob.data); err != nil {
				return nil, fmt.Errorf("attach %s: %w", ref, err)
			}
		}
		listed = append(listed, md)
		attached = append(attached, md.Digest)
	}
	// The tag schema's index: what was there but earlier bundles, and ours.
	tag := repository + ":" + fallbackTag(subject.Digest)
	old, err := fetchIndex(ctx, resolver, tag)
	if err != nil && !errdefs.IsNotFound(err) {
		return nil, err
	}
	for _, d := range old.Manifests {
		if d.ArtifactType != BundleMediaType {
			listed = append(listed, d)
		}
	}
	sort.Slice(listed, func(i, j int) bool { return listed[i].Digest < listed[j].Digest })
	index, _ := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: listed})
	id := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: digest.FromBytes(index), Size: int64(len(index))}
	pusher, err := resolver.Pusher(ctx, tag)
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", tag, err)
	}
	if err := buildkit.WriteBlob(ctx, pusher, id, index); err != nil {
		return nil, fmt.Errorf("attach %s: %w", tag, err)
	}
	return attached, nil
}

// fallbackTag is the referrers tag schema's tag of a digest.
func fallbackTag(d digest.Digest) string {
	return d.Algorithm().String() + "-" + d.Encoded()
}

func fetchIndex(ctx context.Context, resolver remotes.Resolver, ref string) (ocispec.Index, error) {
	var idx ocispec.Index
	_, data, err := fetchTagged(ctx, resolver, ref)
	if err != nil {
		return idx, err
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return idx, fmt.Errorf("%s: not an index: %w", ref, err)
	}
	return idx, nil
}

// FetchBundles returns the bundles that refer to subject, through the
// referrers API or the tag schema; none when there are none.
func FetchBundles(ctx context.Context, resolver remotes.Resolver, repository string, subject digest.Digest) ([]Layer, error) {
	ref := repository + "@" + subject.String()
	f, err := resolver.Fetcher(ctx, ref)
	if err != nil {
		return nil, err
	}
	rf, ok := f.(remotes.ReferrersFetcher)
	if !ok {
		return nil, nil
	}
	descs, err := rf.FetchReferrers(ctx, subject, remotes.WithReferrerArtifactTypes(BundleMediaType))
	if err != nil {
		return nil, fmt.Errorf("referrers of %s: %w", ref, err)
	}
	if len(descs) > maxLayers {
		return nil, fmt.Errorf("%s has %d bundles referring to it; kiln reads at most %d", ref, len(descs), maxLayers)
	}
	var out []Layer
	for _, d := range descs {
		data, err := buildkit.ReadBlob(ctx, f, d, maxObject)
		if err != nil {
			return nil, fmt.Errorf("%s: referrer %s: %w", ref, d.Digest, err)
		}
		var m ocispec.Manifest
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, fmt.Errorf("%s: referrer %s: not a manifest: %w", ref, d.Digest, err)
		}
		if m.Subject == nil || m.Subject.Digest != subject || len(m.Layers) != 1 || m.Layers[0].MediaType != BundleMediaType {
			continue // listed, but not a bundle of this digest
		}
		bundle, err := buildkit.ReadBlob(ctx, f, m.Layers[0], maxObject)
		if err != nil {
			return nil, fmt.Errorf("%s: referrer %s: %w", ref, d.Digest, err)
		}
		out = append(out, Layer{MediaType: BundleMediaType, Data: bundle, Annotations: m.Annotations})
	}
	return out, nil
}
