-- Read-only view of fingerprints over the live generations (contract: service/index/base.py).
-- common.lua comes first; keys, filters and stored values as in insert.lua.
-- KEYS shard bases, in the order of their records (one per call on a Redis Cluster).
-- ARGV[1] current generation; ARGV[2] generations to read;
-- ARGV[3] common: tenants with it in a prompt; ARGV[4] common: tenants with it at all;
-- ARGV[5] struct format of one record; ARGV[6] records per shard, one u32 big-endian per key;
-- ARGV[7] records, grouped by shard: position u32 (in the caller's array), bucket bytes, field
-- bytes (cut by the caller, as for insert.lua); ARGV[8] each record's bit in its shard's presence
-- filters, decimal, space-separated; ARGV[9] filter bytes per bucket.
-- Returns one string of 17-byte rows, big-endian: position u32, tenant u32, doc u32, offset u32,
-- kinds u8; one row per entry of each fingerprint that has entries, or one row with kinds 0 when
-- it is common. (A string, not a list of integers: it is what the caller decodes fastest.)

local cur = tonumber(ARGV[1])
local gens = tonumber(ARGV[2])
local common_prompt = tonumber(ARGV[3])
local common_any = tonumber(ARGV[4])
local format = ARGV[5]
local counts = ARGV[6]
local records = ARGV[7]
local bits = parse_bits(ARGV[8])
local bucket_bytes = tonumber(ARGV[9])
local first_gen = cur - gens + 1

local out, rows = {}, 0
local at, r = 1, 0
for s, base in ipairs(KEYS) do
  local count = sunpack('>I4', counts, 4 * s - 3)
  local pos, mask, lo, hi = filter_positions(bits, r + 1, count, bucket_bytes)
  local gen_base, present = {}, {}
  for gen = first_gen, cur do
    gen_base[gen] = base .. ':' .. gen .. ':'
    present[gen] = filter_read(base .. ':f:' .. gen, bits, r + 1, pos, mask, lo, hi)
  end
  r = r + count
  for i = 1, count do
    local p, bucket, field, next_at = sunpack(format, records, at)
    at = next_at
    local merged, tenants, common = {}, {}, false
    for gen = first_gen, cur do
      if present[gen][i] == 1 then
        local value = redis.call('HGET', gen_base[gen] .. bucket, field)
        if value == COMMON then common = true break end
        if value then
          each(value, function(t, d, o, k)
            if merged[t] then fold(merged[t], d, o, k) else merged[t] = {d, o, k}; tenants[#tenants + 1] = t end
          end)
        end
      end
    end
    local senders = 0
    for _, t in ipairs(tenants) do
      if band(merged[t][3], PROMPT) == PROMPT then senders = senders + 1 end
    end
    if common or senders >= common_prompt or #tenants >= common_any then
      rows = rows + 1
      out[rows] = spack('>I4I4I4I4B', p, 0, 0, 0, 0)
    else
      for _, t in ipairs(tenants) do
        local e = merged[t]
        rows = rows + 1
        out[rows] = spack('>I4I4I4I4B', p, t, e[1], e[2], e[3])
      end
    end
  end
end
return table.concat(out)
