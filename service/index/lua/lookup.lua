-- Read-only view of fingerprints over the live generations (contract: service/index/base.py).
-- KEYS shard bases, in the order of their records (one per call on a Redis Cluster).
-- ARGV[1] current generation; ARGV[2] generations to read;
-- ARGV[3] common: tenants with it in a prompt; ARGV[4] common: tenants with it at all;
-- ARGV[5] struct format of one record; ARGV[6] records per shard, one u32 big-endian per key;
-- ARGV[7] records, grouped by shard: position u32 (in the caller's array), bucket bytes, field
-- bytes (cut by the caller, as for insert.lua); ARGV[8] each record's bit in its shard's presence
-- filters, decimal, space-separated.
-- Keys, filters and stored values as in insert.lua; common.lua comes first.
-- Returns one string of 17-byte rows, big-endian: position u32, tenant u32, doc u32, offset u32,
-- kinds u8; one row per entry of each fingerprint that has entries, or one row with kinds 0 when
-- it is common by senders, or one row with kinds SENDER when it is common only by holders,
-- followed by one row per sender with kinds plus SENDER. (A string, not a list of integers: it is what the caller decodes fastest.)

local cur = tonumber(ARGV[1])
local gens = tonumber(ARGV[2])
local common_prompt = tonumber(ARGV[3])
local common_any = tonumber(ARGV[4])
local format = ARGV[5]
local records = ARGV[7]
local bit_offsets = parse_bits(ARGV[8])
local first_gen = cur - gens + 1
local SENDER = 8  -- a kinds flag: a sender's entry after a common row (redis_index.py)

local out, rows = {}, 0
local at, r = 1, 0
for s, base in ipairs(KEYS) do
  local count = sunpack('>I4', ARGV[6], 4 * s - 3)
  local gen_base, present, reads = {}, {}, bit_reads(bit_offsets, r + 1, r + count)
  for gen = first_gen, cur do
    gen_base[gen] = base .. ':' .. gen .. ':'
    present[gen] = read_bits(base .. ':f:' .. gen, reads)
  end
  for i = 1, count do
    r = r + 1
    local pos, bucket, field, next_at = sunpack(format, records, at)
    at = next_at
    local merged, tenants, marked, common, held = {}, {}, {}, false, false
    for gen = first_gen, cur do
      local value = nil
      if present[gen][i] == 1 then value = redis.call('HGET', gen_base[gen] .. bucket, field) end
      if value == COMMON then common = true break end
      if value then held = merge_stored(value, merged, tenants, marked) or held end
    end
    local senders = 0
    for _, t in ipairs(tenants) do
      if sends(merged[t][3]) and not marked[t] then senders = senders + 1 end
    end
    if common or senders >= common_prompt then
      rows = rows + 1
      out[rows] = spack('>I4I4I4I4B', pos, 0, 0, 0, 0)
    elseif held or #tenants >= common_any then
      rows = rows + 1
      out[rows] = spack('>I4I4I4I4B', pos, 0, 0, 0, SENDER)
      for _, t in ipairs(tenants) do
        local e = merged[t]
        if sends(e[3]) and not marked[t] then
          rows = rows + 1
          out[rows] = spack('>I4I4I4I4B', pos, t, e[1], e[2], e[3] + SENDER)
        end
      end
    else
      for _, t in ipairs(tenants) do
        local e = merged[t]
        rows = rows + 1
        out[rows] = spack('>I4I4I4I4B', pos, t, e[1], e[2], e[3])
      end
    end
  end
end
return table.concat(out)
