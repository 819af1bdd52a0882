package release

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/distribution/reference"
	slsa "github.com/in-toto/attestation/go/predicates/provenance/v1"
	intoto "github.com/in-toto/attestation/go/v1"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kiln-build/kiln/internal/buildkit/export"
	"github.com/kiln-build/kiln/internal/buildkit/managed"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/image"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/publish"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/sign"
)

// BuildType names kiln's release build in its SLSA provenance.
const BuildType = "https://github.com/kiln-build/kiln/release/v1"

// BuilderID names kiln as the SLSA builder.
const BuilderID = "https://github.com/kiln-build/kiln"

// SigningKeyPath is KILN_SIGNING_KEY, else kiln.yaml's signing.key (from
// the repository root); "" when neither is set.
func SigningKeyPath(p *plan.Plan) string {
	if path := os.Getenv(sign.KeyEnv); path != "" {
		return path
	}
	if p.Signing.Key == "" || filepath.IsAbs(p.Signing.Key) || sign.IsEnv(p.Signing.Key) {
		return p.Signing.Key
	}
	return filepath.Join(p.Root, p.Signing.Key)
}

// PublicKeyPath is kiln.yaml's signing.publicKey from the repository root.
func PublicKeyPath(p *plan.Plan) string {
	if p.Signing.PublicKey == "" || filepath.IsAbs(p.Signing.PublicKey) || sign.IsEnv(p.Signing.PublicKey) {
		return p.Signing.PublicKey
	}
	return filepath.Join(p.Root, p.Signing.PublicKey)
}

// loadSigner loads the release's signing key, or says how to give one.
func loadSigner(p *plan.Plan) (*sign.Signer, error) {
	path := SigningKeyPath(p)
	if path == "" {
		return nil, fmt.Errorf("a release is signed, and no signing key is set: set %s (or %s signing.key) to a cosign.key from `cosign generate-key-pair`, and its password in %s or COSIGN_PASSWORD", sign.KeyEnv, config.File, sign.PasswordEnv)
	}
	return sign.LoadKey(path, sign.Password())
}

// Provenance is the SLSA v1 provenance of one released image: kiln's own
// inputs (kiln.yaml, the toolchain pin, the commit and tree state, the
// module files, the bases, whether caches were trusted). It records no
// times, so a release rebuilt from the same commit attests the same.
//
// toolchains are those that compiled the image's platforms, p.Toolchain
// when none are given: a release spread over daemons of several platforms
// ran each one's; the first is the internal parameter.
func Provenance(p *plan.Plan, img plan.Image, configSHA256, caches string, subjects []*intoto.ResourceDescriptor, toolchains ...plan.Toolchain) ([]byte, error) {
	deps := []*intoto.ResourceDescriptor{
		{Uri: "git+" + p.Source + "@" + p.Stamp.Commit, Digest: map[string]string{"gitCommit": p.Stamp.Commit}},
	}
	if len(toolchains) == 0 {
		toolchains = []plan.Toolchain{p.Toolchain}
	}
	for _, tc := range toolchains {
		deps = append(deps, &intoto.ResourceDescriptor{Uri: image.GoPURL("golang.org/toolchain", tc.Module), Digest: map[string]string{"sha256": tc.SHA256}})
	}
	for _, base := range img.AllBases() {
		if named, err := reference.ParseNormalizedNamed(base); err == nil {
			if d, ok := named.(reference.Digested); ok {
				deps = append(deps, &intoto.ResourceDescriptor{Uri: "oci://" + named.Name(), Digest: map[string]string{d.Digest().Algorithm().String(): d.Digest().Encoded()}})
			}
		}
	}
	for _, f := range p.ModFiles {
		if h := p.ModFileHashes[f]; h != "" {
			deps = append(deps, &intoto.ResourceDescriptor{Name: f, Digest: map[string]string{"sha256": h}})
		}
	}
	for _, m := range p.Modules {
		path, version, _ := strings.Cut(m, "@")
		deps = append(deps, &intoto.ResourceDescriptor{Uri: image.GoPURL(path, version)})
	}
	external, err := toStruct(map[string]any{
		"source":    map[string]string{"uri": p.Source, "commit": p.Stamp.Commit, "treeState": p.Stamp.TreeState},
		"version":   p.Stamp.Version,
		"image":     img.Name,
		"platforms": img.PlatformIDs(),
	})
	if err != nil {
		return nil, err
	}
	internal, err := toStruct(map[string]any{
		"config":          map[string]string{"path": config.File, "sha256": configSHA256},
		"toolchain":       toolchains[0],
		"caches":          caches,
		"goEnv":           p.GoEnv,
		"ldflags":         p.Stamp.LDFlags,
		"modMode":         p.ModMode,
		"sourceDateEpoch": p.SourceDateEpoch,
	})
	if err != nil {
		return nil, err
	}
	predicate, err := toStruct(&slsa.Provenance{
		BuildDefinition: &slsa.BuildDefinition{BuildType: BuildType, ExternalParameters: external, InternalParameters: internal, ResolvedDependencies: deps},
		RunDetails:      &slsa.RunDetails{Builder: &slsa.Builder{Id: BuilderID, Version: map[string]string{"kiln": image.KilnVersion(), "buildkit": managed.Version}}},
	})
	if err != nil {
		return nil, err
	}
	return sign.StatementJSON(&intoto.Statement{Type: intoto.StatementTypeUri, Subject: subjects, PredicateType: ProvenancePredicateType, Predicate: predicate})
}

// ProvenancePredicateType is SLSA v1 provenance's.
const ProvenancePredicateType = "https://slsa.dev/provenance/v1"

// toStruct converts a value, through its JSON (protojson's for a message),
// into a predicate or parameters object.
func toStruct(v any) (*structpb.Struct, error) {
	var data []byte
	var err error
	if m, ok := v.(proto.Message); ok {
		data, err = protojson.Marshal(m)
	} else {
		data, err = json.Marshal(v)
	}
	if err != nil {
		return nil, err
	}
	out := &structpb.Struct{}
	return out, protojson.Unmarshal(data, out)
}

// attestRelease signs every pushed image index and platform manifest, and
// attaches to each a signed provenance and the SBOM of each platform's
// binaries, read back from the build.
func attestRelease(ctx context.Context, b *built, signer *sign.Signer, resolver remotes.Resolver, registry, caches string, pushed []ReleasedImage) error {
	p := b.plan
	configData, err := os.ReadFile(filepath.Join(p.Root, config.File))
	if err != nil {
		return err
	}
	configSum := sha256.Sum256(configData)
	for i, img := range p.Images {
		repo := registry + "/" + p.Repository + "/" + img.Name
		indexDigest := digest.Digest(pushed[i].Digest)
		indexDesc, manifests, err := publish.PlatformManifests(ctx, resolver, repo, indexDigest)
		if err != nil {
			return err
		}
		subjects := []*intoto.ResourceDescriptor{{Name: repo, Digest: map[string]string{"sha256": indexDigest.Encoded()}}}
		for _, m := range manifests {
			subjects = append(subjects, &intoto.ResourceDescriptor{Name: repo + " " + config.FormatPlatform(*m.Platform), Digest: map[string]string{"sha256": m.Digest.Encoded()}})
		}
		prov, err := Provenance(p, img, hex.EncodeToString(configSum[:]), caches, subjects, b.toolchains[img.Name]...)
		if err != nil {
			return err
		}
		provenance := statement{prov, ProvenancePredicateType}
		indexAtts := []statement{provenance}
		for j, m := range manifests {
			platform := config.FormatPlatform(*m.Platform)
			binaries := map[string][]byte{}
			for _, bin := range img.Binaries {
				data, err := os.ReadFile(filepath.Join(b.bins[platform], bin))
				if err != nil {
					return fmt.Errorf("SBOM of %s %s: %w", img.Name, platform, err)
				}
				binaries[bin] = data
			}
			doc, err := image.SBOM(img.Name, platform, p.Stamp.Version, p.Created(), binaries)
			if err != nil {
				return err
			}
			predicate := &structpb.Struct{}
			if err := protojson.Unmarshal(doc, predicate); err != nil {
				return err
			}
			st, err := sign.StatementJSON(&intoto.Statement{Type: intoto.StatementTypeUri, PredicateType: image.SPDXPredicateType,
				Subject: []*intoto.ResourceDescriptor{subjects[0], subjects[j+1]}, Predicate: predicate})
			if err != nil {
				return err
			}
			sbom := statement{st, image.SPDXPredicateType}
			indexAtts = append(indexAtts, sbom)
			attached, err := signAndAttach(ctx, signer, resolver, p.Signing.Layout, repo, m, []statement{provenance, sbom})
			if err != nil {
				return err
			}
			pushed[i].Attached = append(pushed[i].Attached, attached...)
		}
		attached, err := signAndAttach(ctx, signer, resolver, p.Signing.Layout, repo, indexDesc, indexAtts)
		if err != nil {
			return err
		}
		pushed[i].Attached = append(pushed[i].Attached, attached...)
	}
	return nil
}

// signAndAttach signs subject and attaches the signature and attestations
// in the layout kiln.yaml names, and returns what it attached.
func signAndAttach(ctx context.Context, signer *sign.Signer, resolver remotes.Resolver, layout, repo string, subject ocispec.Descriptor, atts []statement) ([]Attached, error) {
	if layout == config.LayoutReferrers {
		sig, err := sign.SignatureStatement(subject.Digest)
		if err != nil {
			return nil, err
		}
		all := append([]statement{{sig, sign.SignPredicateType}}, atts...)
		var refs []sign.Referrer
		for _, st := range all {
			b, err := signer.Bundle(st.data)
			if err != nil {
				return nil, err
			}
			refs = append(refs, sign.Referrer{Bundle: b, PredicateType: st.predicateType})
		}
		digests, err := sign.AttachReferrers(ctx, resolver, repo, subject, refs)
		if err != nil {
			return nil, err
		}
		var out []Attached
		for i, d := range digests {
			out = append(out, Attached{Subject: subject.Digest.String(), Ref: repo + "@" + d.String(), Digest: d.String(), PredicateTypes: []string{all[i].predicateType}})
		}
		return out, nil
	}
	sig, err := signer.SignatureLayer(repo, subject.Digest)
	if err != nil {
		return nil, err
	}
	sigDigest, err := sign.Attach(ctx, resolver, repo, subject.Digest, "sig", []sign.Layer{sig})
	if err != nil {
		return nil, err
	}
	var layers []sign.Layer
	var types []string
	for _, st := range atts {
		l, err := signer.AttestationLayer(st.data, st.predicateType)
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
		types = append(types, st.predicateType)
	}
	attDigest, err := sign.Attach(ctx, resolver, repo, subject.Digest, "att", layers)
	if err != nil {
		return nil, err
	}
	return []Attached{
		{Subject: subject.Digest.String(), Ref: repo + ":" + sign.Tag(subject.Digest, "sig"), Digest: sigDigest.String()},
		{Subject: subject.Digest.String(), Ref: repo + ":" + sign.Tag(subject.Digest, "att"), Digest: attDigest.String(), PredicateTypes: types},
	}, nil
}

// statement is an in-toto statement to sign, of a predicate type.
type statement struct {
	data          []byte
	predicateType string
}

// ReleasedImage is a pushed image with what the release attached to it:
// the signatures and attestations of its index and each platform manifest.
type ReleasedImage struct {
	publish.PushResult
	Attached []Attached `json:"attached,omitempty"`
}

// Attached is a signature or attestation manifest a release attached to
// an image: the signature when it carries no predicate types (or
// sign.SignPredicateType alone, in the referrers layout).
type Attached struct {
	Subject        string   `json:"subject"`
	Ref            string   `json:"ref"`
	Digest         string   `json:"digest"`
	PredicateTypes []string `json:"predicateTypes,omitempty"`
}

// exportImageBinaries writes every image's binaries for each of its
// platforms into dir, a new folder, one folder for each platform, and
// returns them by platform; the states are the images' own, so BuildKit
// answers from its cache.
func exportImageBinaries(ctx context.Context, s *session.Session, dir string) (map[string]string, error) {
	var files []export.FileCopy
	bins := map[string]string{}
	for _, img := range s.Plan.Images {
		for _, target := range img.Targets {
			platform := config.FormatPlatform(target)
			sub := strings.ReplaceAll(platform, "/", "-")
			bins[platform] = filepath.Join(dir, sub)
			for _, b := range img.Binaries {
				dest := "/" + sub + "/" + b
				if !slices.ContainsFunc(files, func(f export.FileCopy) bool { return f.Dest == dest }) {
					files = append(files, export.FileCopy{From: s.Binary(b, target), Src: "/" + b, Dest: dest})
				}
			}
		}
	}
	if _, _, err := s.ExportFiles(ctx, "SBOM binaries", files, dir, nil); err != nil {
		return nil, err
	}
	return bins, nil
}
