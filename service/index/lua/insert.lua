-- Index one shard's share of a batch and report what it shares with other tenants.
-- Contract: service/index/base.py. Every key this script touches starts with KEYS[1], whose
-- hash tag pins the whole shard to one Redis Cluster slot.
--
-- KEYS[1]  shard base, e.g. bw:{<key id>:a7}:ix
-- ARGV[1]  current generation        ARGV[2] generations to read     ARGV[3] key TTL (s)
-- ARGV[4]  common threshold (tenants) ARGV[5] bucket bits in shard
-- ARGV[6]  records of 25 bytes, big-endian, in batch order:
--          batch pos u32, tenant u32, doc u32, kind u8, fingerprint 8 bytes, offset u32
-- Stored value per fingerprint: '*' once common, else 13-byte entries
--          tenant u32, doc u32, offset u32, kinds u8 (1 prompt, 2 response)
-- Returns flat groups of five integers: batch pos, other tenant, its first doc, its kinds, count.

local base = KEYS[1]
local cur = tonumber(ARGV[1])
local gens = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local common = tonumber(ARGV[4])
local divisor = 2 ^ (16 - tonumber(ARGV[5]))
local records = ARGV[6]

local COMMON = '*'
local ENTRY = 13

local function bucket_key(gen, fp)
  local bucket = math.floor((string.byte(fp, 2) * 256 + string.byte(fp, 3)) / divisor)
  return base .. ':' .. gen .. ':' .. bucket
end

local hits = {}
local order = {}
local touched = {}

for r = 1, #records, 25 do
  local pos, tenant, doc, kind, fp, offset = struct.unpack('>I4I4I4Bc8I4', records, r)
  -- Merge this fingerprint's entries over the live generations, oldest first.
  local merged, tenants, seen_common, current = {}, {}, false, nil
  local cur_key = bucket_key(cur, fp)
  for gen = cur - gens + 1, cur do
    local key = (gen == cur) and cur_key or bucket_key(gen, fp)
    local value = redis.call('HGET', key, fp)
    if value then
      if gen == cur then current = value end
      if value == COMMON then seen_common = true break end
      for i = 1, #value, ENTRY do
        local t, d, o, k = struct.unpack('>I4I4I4B', value, i)
        local e = merged[t]
        if e then e[3] = bit.bor(e[3], k) else merged[t] = {d, o, k}; tenants[#tenants + 1] = t end
      end
    end
  end
  local mine = merged[tenant]
  local becomes_common = seen_common or #tenants >= common or (not mine and #tenants + 1 >= common)
  if not (seen_common or #tenants >= common) then
    local self_prompt = mine and bit.band(mine[3], 1) == 1
    for _, t in ipairs(tenants) do
      if t ~= tenant then
        local e = merged[t]
        -- A leak goes from a prompt to another tenant's response (see memory.py's _counts).
        local hit
        if kind == 2 then hit = bit.band(e[3], 1) == 1 and not self_prompt else hit = e[3] == 2 end
        if hit then
          local hk = pos .. ':' .. t .. ':' .. e[1] .. ':' .. e[3]
          local h = hits[hk]
          if h then h[5] = h[5] + 1 else
            hits[hk] = {pos, t, e[1], e[3], 1}
            order[#order + 1] = hk
          end
        end
      end
    end
  end
  -- Record this tenant in the current generation.
  local new_value = nil
  if becomes_common then
    if current ~= COMMON then new_value = COMMON end
  elseif not current then
    new_value = struct.pack('>I4I4I4B', tenant, doc, offset, kind)
  else
    local found = false
    for i = 1, #current, ENTRY do
      local t, d, o, k = struct.unpack('>I4I4I4B', current, i)
      if t == tenant then
        found = true
        if bit.bor(k, kind) ~= k then
          new_value = string.sub(current, 1, i - 1) .. struct.pack('>I4I4I4B', t, d, o, bit.bor(k, kind))
            .. string.sub(current, i + ENTRY)
        end
        break
      end
    end
    if not found then new_value = current .. struct.pack('>I4I4I4B', tenant, doc, offset, kind) end
  end
  if new_value then
    redis.call('HSET', cur_key, fp, new_value)
    touched[cur_key] = true
  end
end

for key in pairs(touched) do redis.call('EXPIRE', key, ttl, 'NX') end

local out = {}
for _, hk in ipairs(order) do
  local h = hits[hk]
  for i = 1, 5 do out[#out + 1] = h[i] end
end
return out
