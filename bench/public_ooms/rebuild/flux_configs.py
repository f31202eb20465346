"""FLUX.1's published component configs (black-forest-labs/FLUX.1-schnell and -dev), shared by
the rebuilds that build its components (flux_pipeline.py, dreambooth.py)."""

# The components' published configs (black-forest-labs/FLUX.1-schnell and -dev, their
# subfolders' config.json): what differs between the two is guidance_embeds and the
# scheduler's shifting.
TRANSFORMER = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                   num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                   axes_dims_rope=(16, 56, 56))
VAE = dict(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
           down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
           layers_per_block=2, norm_num_groups=32, act_fn="silu", sample_size=1024, scaling_factor=0.3611,
           shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=True)
CLIP_TEXT = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, projection_dim=768,
                 num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu",
                 layer_norm_eps=1e-5)
T5_XXL = dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
              relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout_rate=0.1,
              layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
VARIANTS = {
    "schnell": dict(guidance_embeds=False, scheduler=dict(shift=1.0, use_dynamic_shifting=False)),
    "dev": dict(guidance_embeds=True, scheduler=dict(shift=3.0, use_dynamic_shifting=True)),
}
